#!/usr/bin/env bash
# Sets up .venv (first run only) and runs the test suite. Extra arguments go to pytest.
#   bash scripts/test.sh           everything (what CI runs)
#   bash scripts/test.sh --fast    the development loop: all but the tests marked slow
# The tests run on NETDATA_TEST_WORKERS worker processes (pytest-xdist; default 3, 0 runs them
# in pytest's own process). On a 2-core machine 2 take 0.69x the wall time of one, and 3, one
# more than the cores (many tests wait on child processes), 0.90x the wall time of 2.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/setup_env.sh
source "$ROOT/scripts/setup_env.sh" test,maxtext,beam
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
args=()
workers="${NETDATA_TEST_WORKERS:-3}"
if [ "$workers" != 0 ]; then
  # worksteal: an idle worker takes tests queued on the other, so the long ones do not pile up.
  args+=(-n "$workers" --dist worksteal)
fi
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
