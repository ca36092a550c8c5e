#!/usr/bin/env bash
# Shared by launch_tpu_vm.sh and launch_gpu_vm.sh (sourced, not run): argument checks, the
# repository archive shipped to hosts, and the command each host runs.

# Each host gets the tree under this directory of its home, the archive beside it.
REMOTE_DIR="maxtext_netdata"
DRY_RUN=0

# The launcher's header comment (after the shebang) is its --help text.
usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

die() {
  echo "${LAUNCHER}: $*" >&2
  exit 2
}

# need_value OPTION VALUE: VALUE must be present for OPTION.
need_value() {
  case "${2-}" in
    "" | -*) die "$1 needs a value" ;;
  esac
}

# quote WORD...: the words as one line that sh and bash read back as the same words (safe
# words as they are, others in single quotes).
quote() {
  local out="" word sq="'"
  for word in "$@"; do
    if [[ -n "$word" && "$word" != *[!A-Za-z0-9_./=:,@%+-]* ]]; then
      out+="${out:+ }$word"
    else
      out+="${out:+ }'${word//$sq/$sq\\$sq$sq}'"
    fi
  done
  printf '%s' "$out"
}

# run CMD...: runs CMD, or with --dry-run prints it (one line, shell-quoted) instead.
run() {
  if [ "$DRY_RUN" = 1 ]; then
    quote "$@"
    echo
  else
    "$@"
  fi
}

# local_config CONFIG: the absolute path of CONFIG (bare names are looked up in configs/ too).
local_config() {
  local config="$1"
  if [ -f "$config" ]; then
    printf '%s' "$(cd "$(dirname "$config")" && pwd)/$(basename "$config")"
  elif [ -f "$ROOT/configs/$config" ]; then
    printf '%s' "$ROOT/configs/$config"
  else
    die "config file not found: $config"
  fi
}

# repo_config CONFIG: CONFIG as a path relative to the repository root, which must be
# committed: other hosts get the committed tree.
repo_config() {
  local path
  path="$(local_config "$1")" || exit 2
  case "$path" in
    "$ROOT"/*) path="${path#"$ROOT"/}" ;;
    *) die "config $1 is outside the repository $ROOT; hosts only get the repository" ;;
  esac
  git -C "$ROOT" cat-file -e "HEAD:$path" 2>/dev/null \
    || die "config $path is not committed; hosts get the committed tree (git archive HEAD)"
  printf '%s' "$path"
}

# check_overrides ARG...: every ARG must be key=value.
check_overrides() {
  local arg
  for arg in "$@"; do
    case "$arg" in
      [A-Za-z_]*=*) ;;
      *) die "expected key=value after the config, got '$arg'" ;;
    esac
  done
}

# check_trainer NAME
check_trainer() {
  case "$1" in
    netdata | maxtext) ;;
    *) die "--trainer must be netdata or maxtext, got '$1'" ;;
  esac
}

# warn_uncommitted: hosts get HEAD only; say so when the tree differs.
warn_uncommitted() {
  if [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no)" ]; then
    echo "${LAUNCHER}: warning: uncommitted changes are not shipped (hosts get HEAD)" >&2
  fi
}

# make_archive PATH: the committed tree as a tar.gz.
make_archive() {
  run git -C "$ROOT" archive --format=tar.gz -o "$1" HEAD
}

# host_command TRAINER ACCELERATOR CONFIG [NAME=VALUE...] -- [key=value...]: the command one
# host runs after receiving the archive in its home: unpack it, then scripts/launch_host.sh
# (set up .venv, start the trainer) with the environment assignments. POSIX sh, so any login
# shell runs it.
host_command() {
  local trainer="$1" accelerator="$2" config="$3"
  shift 3
  local assignments=()
  while [ "$1" != "--" ]; do
    assignments+=("$1")
    shift
  done
  shift
  printf '%s' "mkdir -p $REMOTE_DIR && tar -xzf $REMOTE_DIR.tar.gz -C $REMOTE_DIR && "
  if [ ${#assignments[@]} -gt 0 ]; then
    printf '%s ' "$(quote "${assignments[@]}")"
  fi
  quote bash "$REMOTE_DIR/scripts/launch_host.sh" "$trainer" "$accelerator" "$config" "$@"
}
