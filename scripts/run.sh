#!/usr/bin/env bash
# The main job: sets up .venv (first run only), generates the sample data if absent, trains
# the smoke model on it through the network_grain pipeline (preparing the store on first use),
# trains the same model as many steps on the synthetic dataset (no input cost), half before
# and half after the network run (a machine whose speed drifts then drifts for both), and
# prints: step times and their ratio, data-wait share, real tokens/s, and the eval loss on RTT
# bytes against a unigram baseline. Exit status 1 if the model does not beat that baseline.
# Extra key=value arguments go to both training runs. Outputs: $NETDATA_RUNS (default runs/);
# the sample data: $NETDATA_SAMPLE (default sample_data/raw/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/setup_env.sh
source "$ROOT/scripts/setup_env.sh" test
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
SAMPLE="${NETDATA_SAMPLE:-$ROOT/sample_data/raw}"
RUNS="${NETDATA_RUNS:-$ROOT/runs}"
if [ ! -f "$SAMPLE/.complete" ]; then
  maxtext-netdata generate --out "$SAMPLE"
fi
# Fresh runs: a leftover checkpoint would make the trainer resume instead of training.
rm -rf "$RUNS/smoke_network" "$RUNS/smoke_synthetic" "$RUNS/smoke_synthetic_after"
# Half the network run's steps (the config's, or the steps=... given here) for each half.
HALF="$(python -c 'import sys
from maxtext_netdata import config
print((config.load("configs/smoke.yml", sys.argv[1:]).steps + 1) // 2)' "$@")"
synthetic() {
  maxtext-netdata train configs/smoke.yml base_output_directory="$RUNS" run_name="$1" \
    dataset_type=synthetic "${@:2}" steps="$HALF"
}
echo "== the model on one fixed batch (synthetic: no input cost), half the steps, before..."
synthetic smoke_synthetic "$@"
echo "== the smoke model on the sample data (network_grain)"
maxtext-netdata train configs/smoke.yml base_output_directory="$RUNS" run_name=smoke_network \
  grain_train_files="$SAMPLE/*.parquet" "$@"
echo "== ...and the other half after"
synthetic smoke_synthetic_after "$@"
echo "== summary"
python -m maxtext_netdata.trainer.report "$RUNS/smoke_network/summary.json" \
  "$RUNS/smoke_synthetic/summary.json" "$RUNS/smoke_synthetic_after/summary.json"
