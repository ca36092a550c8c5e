#!/usr/bin/env bash
# Sets up .venv (first run only) and runs the whole test suite. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/setup_env.sh
source "$ROOT/scripts/setup_env.sh" test,maxtext,beam
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
python -m pytest -q "$@"
