#!/usr/bin/env bash
# The digests `maxtext-netdata batches` prints for 12 configs (packing on and off, every field
# order, each context mode alone, two sequence lengths, read threads, Grain workers), 6 steps
# each, on 60,000 generated rows: run it before and after a change that must keep the batches.
#   bash scripts/batch_digests.sh [CHECKOUT] [WORK_DIR] > digests.txt
# CHECKOUT (default: this one) is the code that runs, e.g. a `git worktree` of the commit
# before; WORK_DIR (default /tmp/netdata-batch-digests) holds the generated rows.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHECKOUT="$(cd "${1:-$ROOT}" && pwd)"
WORK="${2:-/tmp/netdata-batch-digests}"
if [ -z "${PYTHON:-}" ] && [ ! -x "$ROOT/.venv/bin/python" ]; then
  # shellcheck source=scripts/setup_env.sh
  source "$ROOT/scripts/setup_env.sh" "" >&2  # a fresh clone: .venv set up first, as run.sh does
fi
PY="${PYTHON:-$ROOT/.venv/bin/python}"
export JAX_PLATFORMS=cpu PYTHONPATH="$CHECKOUT"
cd "$CHECKOUT"
[ -f "$WORK/raw/.complete" ] || "$PY" -m maxtext_netdata generate --out "$WORK/raw" --rows 60000 --shards 2 >/dev/null
base=("grain_train_files=$WORK/raw/*.parquet" "base_output_directory=$WORK" "num_epoch=-1")
one="max_target_length=1024 global_batch_size_to_load=8 grain_worker_count=0"
configs=(
  "$one"
  "$one grain_num_threads=0"
  "$one network_field_order=fixed"
  "$one network_field_order=hashed"
  "$one packing=false"
  "$one packing=false network_field_order=fixed"
  "$one packing=false network_field_order=hashed"
  "$one network_mode_weights=[1,0,0]"
  "$one network_mode_weights=[0,1,0]"
  "$one network_mode_weights=[0,0,1]"
  "max_target_length=2048 global_batch_size_to_load=8 grain_worker_count=0 data_shuffle_seed=1"
  "max_target_length=1024 global_batch_size_to_load=8 grain_worker_count=2"
)
for config in "${configs[@]}"; do
  echo "# $config"
  # shellcheck disable=SC2086 # each config is several key=value words
  "$PY" -m maxtext_netdata batches configs/base.yml "${base[@]}" $config --steps 6
done
