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
python -m pytest -q "${args[@]}"
