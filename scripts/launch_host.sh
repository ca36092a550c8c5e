#!/usr/bin/env bash
# Runs on one training host, in the tree the launchers ship: sets up .venv (scripts/setup_env.sh
# plus jax for the accelerator, at the jax version of constraints.txt) and starts the trainer.
#
# Usage: scripts/launch_host.sh netdata|maxtext tpu|cuda12 CONFIG [key=value ...]
#   netdata: maxtext-netdata train CONFIG key=value ...
#   maxtext: maxtext-netdata maxtext-train CONFIG key=value ... (with the maxtext extra)
# The caller's environment (JAX_NUM_PROCESSES, JAX_PROCESS_ID, ...) reaches the trainer.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ $# -lt 3 ]; then
  echo "usage: scripts/launch_host.sh netdata|maxtext tpu|cuda12 CONFIG [key=value ...]" >&2
  exit 2
fi
trainer="$1"
accelerator="$2"
shift 2
case "$trainer" in
  netdata) extras="" command=(maxtext-netdata train) ;;
  maxtext) extras="maxtext" command=(maxtext-netdata maxtext-train) ;;
  *) echo "launch_host: trainer must be netdata or maxtext, got '$trainer'" >&2; exit 2 ;;
esac
case "$accelerator" in
  tpu | cuda12) ;;
  *) echo "launch_host: accelerator must be tpu or cuda12, got '$accelerator'" >&2; exit 2 ;;
esac
jax_version="$(sed -n 's/^jax==//p' constraints.txt)"

# shellcheck source=scripts/setup_env.sh
source "$ROOT/scripts/setup_env.sh" "$extras"
# uv when setup_env.sh installed it (the accelerator's jaxlib plugin is hundreds of MB), with
# the system's certificates and pip as the fallback, as setup_env.sh installs.
if ! { [ -x "$VIRTUAL_ENV/bin/uv" ] &&
  uv pip install --quiet --system-certs --python "$VIRTUAL_ENV/bin/python" -c constraints.txt \
    "jax[$accelerator]==$jax_version"; }; then
  python -m pip install -q --disable-pip-version-check -c constraints.txt \
    "jax[$accelerator]==$jax_version"
fi
echo "launch_host: $(hostname): ${command[*]} $*" >&2
exec "${command[@]}" "$@"
