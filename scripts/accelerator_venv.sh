#!/usr/bin/env bash
# Makes, on a machine with network, a Python 3.12 virtual environment like the accelerator
# VM's image, so that scripts/accelerator_check.sh runs here as it will run there:
#   bash scripts/accelerator_venv.sh DIR
#   bash scripts/accelerator_wheels.sh .whl
#   PYTHON=DIR/bin/python bash scripts/accelerator_check.sh --dry-run
# The image (docs/performance.md, "On an accelerator"): jax and jaxlib 0.11.2, the oldest
# jax setup.py admits, numpy 2.5.2, and the packages in IMAGE at constraints.txt's versions;
# not Grain, pydantic, tensorboardX or duckdb, which travel as wheels (accelerator_wheels.sh)
# or stay behind. Installs with the uv scripts/setup_env.sh put in .venv, else with pip.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:?usage: bash scripts/accelerator_venv.sh DIR}"
JAX_VERSION=0.11.2
NUMPY_VERSION=2.5.2
IMAGE=(
  jax jaxlib numpy flax optax orbax-checkpoint numba pyarrow tqdm pyyaml absl-py etils psutil
  cloudpickle fsspec packaging zipp matplotlib pip
)

if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3.12
  [ -x "$ROOT/.venv/bin/python" ] && PYTHON="$ROOT/.venv/bin/python"
fi
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
grep -vE "^(jax|jaxlib|numpy)==" "$ROOT/constraints.txt" >"$constraints"
printf 'jax==%s\njaxlib==%s\nnumpy==%s\n' "$JAX_VERSION" "$JAX_VERSION" "$NUMPY_VERSION" \
  >>"$constraints"

uv="$ROOT/.venv/bin/uv"
if ! {
  [ -x "$uv" ] && "$uv" venv --quiet --python "$PYTHON" "$DIR" &&
    "$uv" pip install --quiet --system-certs --python "$DIR/bin/python" -c "$constraints" \
      "${IMAGE[@]}"
}; then
  echo "accelerator_venv: installing with pip" >&2
  rm -rf "$DIR"
  "$PYTHON" -m venv "$DIR"
  "$DIR/bin/python" -m pip install -q --disable-pip-version-check -c "$constraints" "${IMAGE[@]}"
fi
"$DIR/bin/python" -c 'import jax, platform, sys
print(f"{sys.argv[1]}: python {platform.python_version()}, jax {jax.__version__}")' "$DIR"
