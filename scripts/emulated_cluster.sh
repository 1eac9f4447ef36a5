#!/usr/bin/env bash
# shellcheck disable=SC2317  # cleanup and stop_pids run from traps, they are reachable
# Emulates a 2-node cluster on this machine and runs one hsgd job on it.
#
# Two network namespaces are the "nodes"; one veth pair is the link between them, limited by a
# tbf qdisc on each end (both directions). hsgd-rendezvous runs in node 0; one hsgd-run agent per
# node starts --nproc-per-node workers of PROGRAM. Workers of one node share memory (same
# GROUP_RANK, see comm/shm_allreduce.h); groups that span the nodes go over the veth via TCP.
#
# Only the link's rate is emulated: netem (delay, loss) is not available here, and all nodes
# share this machine's cores.
#
# Everything this script starts (namespaces, rendezvous server, agents and their workers) is
# removed on exit, including on Ctrl-C, on a failure and at --timeout.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)

usage() {
  cat <<EOF
Usage: $0 [OPTIONS] -- PROGRAM [ARGS...]

Runs PROGRAM as an hsgd job on 2 emulated nodes (network namespaces joined by a rate-limited
veth pair). Needs root (ip netns, tc).

Options:
  --rate RATE          rate of the link in each direction, tc syntax (50mbit, 1gbit), or
                       'none' for no limit (default: 100mbit)
  --nproc-per-node P   workers per node (default: 2)
  --port PORT          port of hsgd-rendezvous on node 0 (default: 29400)
  --subnet A.B.C       node K gets A.B.C.(K+1)/24 (default: 10.77.0)
  --log-dir DIR        per-rank logs under DIR/node<K>/ instead of the terminal
  --stats FILE         write link statistics as key=value lines (rate, bytes each way, seconds)
  --timeout S          stop the job after S seconds, exit code 124 (default: 1800)
  --build DIR          hsgd build tree (default: $root/build)
  -h, --help           this help

The job id is unique per call. PROGRAM runs with the working directory of this script's caller.
Exit code: the agents' (0 when every worker on both nodes exited 0), 124 on --timeout,
77 when network namespaces cannot be created (not root, or no permission), 2 on a usage error.

Example (2 nodes x 2 workers, 100 Mbit/s between the nodes):
  $0 --rate 100mbit -- build/apps/train_mlp/train_mlp --mode hierarchical \\
      --subgroup-size 1 --hierarchy 2:2,16:4 --epochs 1
EOF
}

die() { echo "emulated_cluster: error: $1" >&2; exit "${2:-1}"; }

rate=100mbit
nproc=2
port=29400
subnet=10.77.0
log_dir=""
stats_file=""
timeout_s=1800
build="$root/build"
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) rate=${2:?--rate needs a value}; shift 2 ;;
    --nproc-per-node) nproc=${2:?--nproc-per-node needs a value}; shift 2 ;;
    --port) port=${2:?--port needs a value}; shift 2 ;;
    --subnet) subnet=${2:?--subnet needs a value}; shift 2 ;;
    --log-dir) log_dir=${2:?--log-dir needs a value}; shift 2 ;;
    --stats) stats_file=${2:?--stats needs a value}; shift 2 ;;
    --timeout) timeout_s=${2:?--timeout needs a value}; shift 2 ;;
    --build) build=${2:?--build needs a value}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "emulated_cluster: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[ $# -ge 1 ] || { echo "emulated_cluster: no PROGRAM after --" >&2; usage >&2; exit 2; }
[[ $nproc =~ ^[1-9][0-9]*$ ]] || die "--nproc-per-node '$nproc' is not a positive integer" 2
if ! [[ $port =~ ^[0-9]+$ ]] || [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
  die "--port '$port' is not in [1, 65535]" 2
fi
[[ $timeout_s =~ ^[1-9][0-9]*$ ]] || die "--timeout '$timeout_s' is not a positive integer" 2
[[ $subnet =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "--subnet '$subnet' is not of the form A.B.C" 2
[[ $rate == none || $rate =~ ^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit)$ ]] ||
  die "--rate '$rate' is not 'none' or a tc rate like 100mbit, 1gbit" 2

run=$build/apps/hsgd-run/hsgd-run
rendezvous=$build/apps/hsgd-rendezvous/hsgd-rendezvous
if [ ! -x "$run" ] || [ ! -x "$rendezvous" ]; then
  die "no hsgd-run / hsgd-rendezvous under $build (build first)"
fi

if [ "$(id -u)" -ne 0 ]; then
  die "needs root to create network namespaces and tc qdiscs (run with sudo)" 77
fi

# Names unique to this call, so that two clusters (or a crashed earlier one) do not collide.
tag="hsgdemu$$"
ns=("${tag}n0" "${tag}n1")
addr=("$subnet.1" "$subnet.2")
job_id="emu-$$-$(date +%s)"
work=$(mktemp -d "/tmp/${tag}.XXXXXX")
agent_pids=()
server_pid=""

# Sends SIGTERM to the pids still alive, waits up to $1 seconds for them, then SIGKILLs the rest.
stop_pids() {
  local grace=$1; shift
  local pid alive
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq $((grace * 10))); do
    alive=0
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" -eq 0 ] && return 0
    sleep 0.1
  done
  for pid in "$@"; do kill -KILL "$pid" 2>/dev/null || true; done
}

cleanup() {
  local rc=$?
  # A second Ctrl-C (or a SIGTERM from a driver) must not cut the cleanup short.
  trap - EXIT
  trap '' INT TERM
  # hsgd-run forwards SIGTERM to its workers and stops them (SIGKILL after its grace period of
  # 10 s); workers also have PR_SET_PDEATHSIG, so SIGKILL of an agent takes them down too.
  [ ${#agent_pids[@]} -gt 0 ] && stop_pids 15 "${agent_pids[@]}"
  [ -n "$server_pid" ] && stop_pids 5 "$server_pid"
  for n in "${ns[@]}"; do
    ip netns pids "$n" 2>/dev/null | while read -r pid; do
      kill -KILL "$pid" 2>/dev/null || true
    done
    ip netns del "$n" 2>/dev/null || true  # also removes the veth pair
  done
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "emulated_cluster: interrupted, stopping the job" >&2; exit 130' INT
trap 'echo "emulated_cluster: terminated, stopping the job" >&2; exit 143' TERM

# ---- nodes and link ----
for k in 0 1; do
  ip netns add "${ns[$k]}" 2>"$work/err" ||
    die "cannot create network namespace ${ns[$k]}: $(cat "$work/err")" 77
  ip -n "${ns[$k]}" link set lo up
done
ip link add veth0 netns "${ns[0]}" type veth peer name veth1 netns "${ns[1]}"
for k in 0 1; do
  ip -n "${ns[$k]}" addr add "${addr[$k]}/24" dev "veth$k"
  ip -n "${ns[$k]}" link set "veth$k" up
  if [ "$rate" != none ]; then
    # burst: 10 ms at the rate (at least 32 KiB), enough for tbf to reach the rate at HZ=250.
    burst=$(awk -v r="$rate" 'BEGIN {
      m = 1; if (r ~ /gbit$/) m = 1e9; else if (r ~ /mbit$/) m = 1e6; else if (r ~ /kbit$/) m = 1e3;
      sub(/[a-z]+$/, "", r); b = r * m / 8 / 100; if (b < 32768) b = 32768; printf "%d", b }')
    tc -n "${ns[$k]}" qdisc add dev "veth$k" root tbf rate "$rate" burst "$burst" latency 100ms
  fi
done
link_bytes() {  # bytes sent by node $1 on its end of the link
  ip netns exec "${ns[$1]}" cat "/sys/class/net/veth$1/statistics/tx_bytes"
}

# ---- rendezvous server on node 0 ----
ip netns exec "${ns[0]}" "$rendezvous" --host "${addr[0]}" --port "$port" >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do
  grep -q '^listening on' "$work/server.log" && break
  kill -0 "$server_pid" 2>/dev/null || die "hsgd-rendezvous exited: $(cat "$work/server.log")"
  sleep 0.1
done
grep -q '^listening on' "$work/server.log" ||
  die "hsgd-rendezvous did not listen on ${addr[0]}:$port within 10 s: $(cat "$work/server.log")"

echo "emulated_cluster: 2 nodes x $nproc workers, link ${addr[0]} <-> ${addr[1]} at $rate" \
  "each way, rendezvous ${addr[0]}:$port, job $job_id" >&2
bytes0_start=$(link_bytes 0)
bytes1_start=$(link_bytes 1)
job_start_s=$(date +%s.%N)

# ---- one agent per node ----
for k in 0 1; do
  log_args=()
  [ -n "$log_dir" ] && log_args=(--log-dir "$log_dir/node$k")
  ip netns exec "${ns[$k]}" "$run" --nnodes 2 --node-rank "$k" --nproc-per-node "$nproc" \
    --rdzv-endpoint "${addr[0]}:$port" --rdzv-id "$job_id" --rdzv-timeout 60 \
    "${log_args[@]}" -- "$@" &
  agent_pids+=($!)
done

# Waits for both agents; an agent that fails makes the other stop its workers too (hsgd-run's
# own protocol), so a short grace after the first exit is enough.
deadline=$(( $(date +%s) + timeout_s ))
rc=0
declare -A exited=()
while [ ${#exited[@]} -lt 2 ]; do
  for k in 0 1; do
    [ -n "${exited[$k]:-}" ] && continue
    if ! kill -0 "${agent_pids[$k]}" 2>/dev/null; then
      code=0
      wait "${agent_pids[$k]}" || code=$?
      exited[$k]=$code
      [ "$code" -ne 0 ] && [ "$rc" -eq 0 ] && rc=$code
    fi
  done
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "emulated_cluster: job still running after --timeout $timeout_s s; stopping it" >&2
    exit 124  # cleanup stops the agents
  fi
  [ ${#exited[@]} -lt 2 ] && sleep 0.2
done
agent_pids=()

job_s=$(awk -v a="$job_start_s" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
bytes01=$(( $(link_bytes 0) - bytes0_start ))
bytes10=$(( $(link_bytes 1) - bytes1_start ))
echo "emulated_cluster: exit code $rc after $job_s s; bytes across the link:" \
  "node0->node1 $bytes01, node1->node0 $bytes10" >&2
if [ -n "$stats_file" ]; then
  {
    echo "rate=$rate"
    echo "nproc_per_node=$nproc"
    echo "exit_code=$rc"
    echo "seconds=$job_s"
    echo "bytes_node0_to_node1=$bytes01"
    echo "bytes_node1_to_node0=$bytes10"
  } >"$stats_file"
fi
exit "$rc"
