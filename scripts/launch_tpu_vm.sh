#!/usr/bin/env bash
# Trains on every worker of a Cloud TPU VM slice at once (one process per worker).
#
# Usage: scripts/launch_tpu_vm.sh --name TPU_NAME --zone ZONE [--project PROJECT]
#          [--trainer netdata|maxtext] [--dry-run] CONFIG [key=value ...]
#
# Ships the committed tree (git archive HEAD) to all workers and runs scripts/launch_host.sh on
# each (sets up .venv with jax[tpu], then starts the trainer):
#   --trainer netdata (default): maxtext-netdata train CONFIG key=value ...
#       with JAX_NUM_PROCESSES=auto: jax.distributed detects the slice's workers itself;
#   --trainer maxtext: maxtext-netdata maxtext-train CONFIG key=value ...
#       (MaxText starts jax.distributed on TPUs itself).
# The workers need Python 3.12 (a TPU VM image on Ubuntu 24.04 has it) and the data at the
# paths the config names (gs:// URIs work on every worker). --dry-run prints the commands.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LAUNCHER="launch_tpu_vm"
# shellcheck source=scripts/launch_common.sh
source "$ROOT/scripts/launch_common.sh"

name="" zone="" project="" trainer="netdata"
while [ $# -gt 0 ]; do
  case "$1" in
    --name | --zone | --project | --trainer)
      need_value "$1" "${2-}"
      case "$1" in
        --name) name="$2" ;;
        --zone) zone="$2" ;;
        --project) project="$2" ;;
        --trainer) trainer="$2" ;;
      esac
      shift 2
      ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) break ;;
  esac
done
[ -n "$name" ] || die "--name TPU_NAME is required"
[ -n "$zone" ] || die "--zone ZONE is required"
[ $# -ge 1 ] || die "CONFIG is required (see --help)"
check_trainer "$trainer"
config="$(repo_config "$1")"
shift
check_overrides "$@"
warn_uncommitted

gcloud_target=(--zone "$zone" --worker=all)
if [ -n "$project" ]; then
  gcloud_target+=(--project "$project")
fi
environment=()
if [ "$trainer" = netdata ]; then
  environment=(JAX_NUM_PROCESSES=auto)
fi
command="$(host_command "$trainer" tpu "$config" "${environment[@]}" -- "$@")"

archive="${TMPDIR:-/tmp}/maxtext_netdata-$$.tar.gz"
if [ "$DRY_RUN" = 0 ]; then
  trap 'rm -f "$archive"' EXIT
fi
make_archive "$archive"
run gcloud compute tpus tpu-vm scp "$archive" "$name:$REMOTE_DIR.tar.gz" "${gcloud_target[@]}"
run gcloud compute tpus tpu-vm ssh "$name" "${gcloud_target[@]}" --command "$command"
