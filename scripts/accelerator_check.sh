#!/usr/bin/env bash
# The accelerator check in one command, for a bare GPU or TPU VM without network:
#   bash scripts/accelerator_check.sh [--dry-run] [--out DIR] [--wheels WHEELS]
#       [more options, key=value ...]
# Installs the wheels in WHEELS (default .whl/; scripts/accelerator_wheels.sh fetches them
# where there is network) into a folder of its own, puts them and this checkout on
# PYTHONPATH, prints the Python and the devices, then runs
# `python -m maxtext_netdata.bench.accelerator_check` (its --help lists the options), its
# output also in DIR/check.log. DIR defaults to $OUT when set, else the run folder
# (runs/accelerator_check). --dry-run: the same check on the CPU with a tiny model, about two
# minutes on two cores (15 short trainings, each compiled). Python: $PYTHON, else
# .venv/bin/python, else python3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

out=""
wheel_dir=.whl
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out)
      out="${2:?--out needs a folder}"
      shift 2
      ;;
    --out=*)
      out="${1#--out=}"
      shift
      ;;
    --wheels)
      wheel_dir="${2:?--wheels needs a folder}"
      shift 2
      ;;
    --wheels=*)
      wheel_dir="${1#--wheels=}"
      shift
      ;;
    *)
      args+=("$1")
      shift
      ;;
  esac
done
out="${out:-${OUT:-runs/accelerator_check}}"
mkdir -p "$out"

if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

pythonpath="$ROOT"
shopt -s nullglob
wheels=("$wheel_dir"/*.whl)
if [ ${#wheels[@]} -gt 0 ]; then
  site="$(mktemp -d "${TMPDIR:-/tmp}/maxtext_netdata_site.XXXXXX")"
  trap 'rm -rf "$site"' EXIT
  echo "installing ${#wheels[@]} wheels from $wheel_dir into $site"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    "${wheels[@]}"
  pythonpath="$site:$pythonpath"
else
  echo "no wheels in $wheel_dir: the installed packages are used"
fi
export PYTHONPATH="$pythonpath${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

echo "python: $(command -v "$PYTHON") ($("$PYTHON" --version 2>&1))"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi

"$PYTHON" -m maxtext_netdata.bench.accelerator_check --out "$out" "${args[@]}" 2>&1 \
  | tee "$out/check.log"
