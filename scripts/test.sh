#!/usr/bin/env bash
# Sets up .venv (first run only) and runs the test suite. Extra arguments go to pytest.
#   bash scripts/test.sh           everything (what CI runs)
#   bash scripts/test.sh --fast    the development loop: all but the tests marked slow
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/setup_env.sh
source "$ROOT/scripts/setup_env.sh" test,maxtext,beam
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
args=()
for arg in "$@"; do
  if [ "$arg" = "--fast" ]; then
    args+=(-m "not slow")
  else
    args+=("$arg")
  fi
done
# /dev/shm entries the suite leaves behind are named with the test module they appeared in
# (a warning: another program's entries would show up here too).
shm_entries() {
  local path
  for path in /dev/shm/*; do
    [ -e "$path" ] && echo "${path#/dev/shm/}"
  done
  return 0
}
shm_before="$(mktemp)"
NETDATA_SHM_LOG="$(mktemp)"
export NETDATA_SHM_LOG
shm_entries > "$shm_before"
status=0
python -m pytest -q "${args[@]}" || status=$?
while read -r entry; do
  if ! grep -qxF "$entry" "$shm_before"; then
    module="$(grep -m1 "^$entry " "$NETDATA_SHM_LOG" | cut -d' ' -f2 || true)"
    echo "test.sh: /dev/shm/$entry was left behind by the suite (it appeared in: ${module:-?})" >&2
  fi
done < <(shm_entries)
rm -f "$shm_before" "$NETDATA_SHM_LOG"
exit "$status"
