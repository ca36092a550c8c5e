#!/usr/bin/env bash
# Sets up .venv (first run only) and runs the main job on built-in sample data.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/setup_env.sh
source "$ROOT/scripts/setup_env.sh" test
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
SAMPLE="$ROOT/sample_data/raw"
if [ ! -f "$SAMPLE/.complete" ]; then
  maxtext-netdata generate --out "$SAMPLE"
fi
FIRST="$(find "$SAMPLE" -name '*.parquet' | sort | head -1)"
maxtext-netdata tokenize "$FIRST" --limit 3 --field-order fixed
maxtext-netdata tokenize "$FIRST" --limit 3 --field-order fixed \
  | maxtext-netdata decode -
