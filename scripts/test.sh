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
shm_before="$(mktemp)"
export NETDATA_SHM_LOG="$(mktemp)"
ls /dev/shm > "$shm_before" 2>/dev/null || true
status=0
python -m pytest -q "${args[@]}" || status=$?
left="$(ls /dev/shm 2>/dev/null | grep -vxFf "$shm_before" || true)"
if [ -n "$left" ]; then
  echo "test.sh: /dev/shm entries left behind by the suite (entry, module it appeared in):" >&2
  for entry in $left; do
    echo "  $entry $(grep -m1 "^$entry " "$NETDATA_SHM_LOG" | cut -d' ' -f2 || true)" >&2
  done
fi
rm -f "$shm_before" "$NETDATA_SHM_LOG"
exit "$status"
