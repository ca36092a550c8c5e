#!/usr/bin/env bash
# Trains on GPU VMs: this VM alone, or several VMs at once (one process per VM).
#
# Usage: scripts/launch_gpu_vm.sh [--hosts HOST[,HOST...]] [--coordinator ADDRESS] [--port PORT]
#          [--trainer netdata|maxtext] [--dry-run] CONFIG [key=value ...]
#
# Without --hosts: one process here over all of this VM's GPUs (scripts/launch_host.sh in this
# tree: sets up .venv with jax[cuda12], then starts the trainer).
# With --hosts: ships the committed tree (git archive HEAD) to each host with scp, then starts
# scripts/launch_host.sh on every host at once with ssh and waits for all of them. With more
# than one host, host i runs process i of jax.distributed: JAX_PROCESS_ID=i,
# JAX_NUM_PROCESSES=<hosts>, JAX_COORDINATOR_ADDRESS=<coordinator>:<port>; the coordinator is
# the first host (--coordinator: its address as the other hosts reach it), port 8476 unless
# --port. --trainer maxtext gets the same in MaxText's names (JAX_COORDINATOR_IP,
# JAX_COORDINATOR_PORT, NNODES, NODE_RANK) and hardware=gpu.
#   --trainer netdata (default): maxtext-netdata train CONFIG key=value ...
#   --trainer maxtext: maxtext-netdata maxtext-train CONFIG key=value ...
# --dry-run prints the commands instead of running them (background ones end in " &").
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LAUNCHER="launch_gpu_vm"
# shellcheck source=scripts/launch_common.sh
source "$ROOT/scripts/launch_common.sh"

host_list="" coordinator="" port="8476" trainer="netdata"
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts | --coordinator | --port | --trainer)
      need_value "$1" "${2-}"
      case "$1" in
        --hosts) host_list="$2" ;;
        --coordinator) coordinator="$2" ;;
        --port) port="$2" ;;
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
[ $# -ge 1 ] || die "CONFIG is required (see --help)"
check_trainer "$trainer"
case "$port" in
  *[!0-9]*) die "--port must be a number, got '$port'" ;;
esac
config_arg="$1"
shift
check_overrides "$@"
overrides=("$@")
if [ "$trainer" = maxtext ] && [[ " ${overrides[*]} " != *" hardware="* ]]; then
  overrides+=(hardware=gpu)
fi

if [ -z "$host_list" ]; then
  [ -z "$coordinator" ] || die "--coordinator needs --hosts"
  run bash "$ROOT/scripts/launch_host.sh" "$trainer" cuda12 "$(local_config "$config_arg")" \
    "${overrides[@]}"
  exit 0
fi

IFS=',' read -r -a hosts <<<"$host_list"
for host in "${hosts[@]}"; do
  [ -n "$host" ] || die "--hosts has an empty entry: '$host_list'"
done
config="$(repo_config "$config_arg")"
warn_uncommitted
num_hosts=${#hosts[@]}
coordinator="${coordinator:-${hosts[0]}}"

archive="${TMPDIR:-/tmp}/maxtext_netdata-$$.tar.gz"
if [ "$DRY_RUN" = 0 ]; then
  trap 'rm -f "$archive"' EXIT
fi
make_archive "$archive"
for host in "${hosts[@]}"; do
  run scp -q "$archive" "$host:$REMOTE_DIR.tar.gz"
done

pids=()
trap 'kill "${pids[@]}" 2>/dev/null; exit 130' INT TERM
for i in "${!hosts[@]}"; do
  environment=()
  if [ "$num_hosts" -gt 1 ] && [ "$trainer" = netdata ]; then
    environment=(JAX_COORDINATOR_ADDRESS="$coordinator:$port" JAX_NUM_PROCESSES="$num_hosts"
      JAX_PROCESS_ID="$i")
  elif [ "$num_hosts" -gt 1 ]; then
    environment=(JAX_COORDINATOR_IP="$coordinator" JAX_COORDINATOR_PORT="$port"
      NNODES="$num_hosts" NODE_RANK="$i")
  fi
  command="$(host_command "$trainer" cuda12 "$config" "${environment[@]}" -- "${overrides[@]}")"
  if [ "$DRY_RUN" = 1 ]; then
    echo "$(quote ssh "${hosts[$i]}" "$command") &"
  else
    # shellcheck disable=SC2029  # the command is composed here, for the remote shell
    ssh "${hosts[$i]}" "$command" &
    pids+=($!)
  fi
done
if [ "$DRY_RUN" = 1 ]; then
  echo wait
  exit 0
fi
failed=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "$LAUNCHER: process $i on ${hosts[$i]} failed" >&2
    failed=1
  fi
done
exit "$failed"
