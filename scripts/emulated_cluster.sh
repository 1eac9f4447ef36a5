#!/usr/bin/env bash
# shellcheck disable=SC2317  # cleanup and stop_pids run from traps, they are reachable
# Emulates a 2-node cluster (or 2 racks of nodes) on this machine and runs one hsgd job on it.
#
# Network namespaces are the "nodes". With 2 nodes (the default) one veth pair is the link
# between them, limited by a tbf qdisc on each end (both directions). With --racks 2, a further
# namespace plays the switches: one bridge per rack, each node's veth attached to its rack's
# bridge (tbf at --rack-rate on both ends), and one veth pair between the two bridges (tbf at
# --rate on both ends) is the inter-rack link; all nodes share one /24. hsgd-rendezvous runs in
# node 0; one hsgd-run agent per node starts --nproc-per-node workers of PROGRAM. Workers of one
# node share memory (same GROUP_RANK, see comm/process_group/shm_allreduce.h); groups that span nodes use TCP.
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

Runs PROGRAM as an hsgd job on emulated nodes: by default 2 network namespaces joined by a
rate-limited veth pair; with --racks 2, --nodes namespaces in 2 racks (node K in rack
K / (nodes/2)) behind two bridges joined by a rate-limited inter-rack link. Needs root (ip netns,
tc).

Options:
  --rate RATE          rate of the link between the nodes (--racks 1) or between the racks
                       (--racks 2) in each direction, tc syntax (50mbit, 1gbit), or 'none' for
                       no limit (default: 100mbit)
  --nodes N            nodes (default: 2); more than 2 needs --racks 2
  --racks R            1 (default: 2 nodes on one veth pair) or 2 (N/2 nodes per rack)
  --rack-rate RATE     --racks 2: rate of each node's link to its rack's bridge, each
                       direction, or 'none' (default: 1gbit)
  --nproc-per-node P   workers per node (default: 2)
  --port PORT          port of hsgd-rendezvous on node 0 (default: 29400)
  --subnet A.B.C       node K gets A.B.C.(K+1)/24 (default: 10.77.0)
  --log-dir DIR        per-rank logs under DIR/node<K>/ instead of the terminal
  --stats FILE         write link statistics as key=value lines (rate, bytes each way, seconds,
                       per node TCP retransmissions and timeouts and the packets tbf dropped)
  --timeout S          stop the job after S seconds, exit code 124 (default: 1800)
  --insecure           plain TCP between the processes of the job (by default TLS 1.3 keyed by
                       a random token made for the run, in a 0600 file; docs/security.md)
  --token-file FILE    key the job with FILE's token instead of a new one (not with --insecure)
  --job-id ID          the job id (default: emu-PID-SECONDS, unique per call)
  --capture FILE       record the link's packets with tcpdump in node 1's namespace (its end of
                       the link, --racks 1 only) into FILE (pcap) from before the rendezvous
                       server starts until the job ended; prints the packets captured and those
                       the kernel dropped
  --hook CMD           run CMD (bash -c) once the rendezvous server listens and before the agents
                       start, and wait for it to exit (at most --timeout seconds; a non-zero exit
                       stops the run). Its environment has EMU_NAMESPACES (the nodes' namespaces,
                       node 0 first, space-separated), EMU_ADDRS (their addresses, likewise),
                       EMU_PORT and EMU_JOB_ID. What it leaves running in the nodes' namespaces
                       is killed when the run ends.
  --build DIR          hsgd build tree (default: $root/build)
  -h, --help           this help

The job id is unique per call unless --job-id names one. PROGRAM runs with the working directory
of this script's caller.
Exit code: the agents' (0 when every worker on every node exited 0), 124 on --timeout,
77 when network namespaces cannot be created (not root, or no permission), 2 on a usage error.

Example (2 nodes x 2 workers, 100 Mbit/s between the nodes):
  $0 --rate 100mbit -- build/apps/train_mlp/train_mlp --mode hierarchical \\
      --subgroup-size 1 --hierarchy 2:2,16:4 --epochs 1
Example (2 racks x 2 nodes x 1 worker, 1 Gbit/s in a rack, 100 Mbit/s between the racks):
  $0 --nodes 4 --racks 2 --rack-rate 1gbit --rate 100mbit --nproc-per-node 1 -- \\
      build/apps/train_mlp/train_mlp --mode hierarchical --subgroup-size 1 --hierarchy 1:2,16:4
EOF
}

die() { echo "emulated_cluster: error: $1" >&2; exit "${2:-1}"; }

rate=100mbit
nodes=2
racks=1
rack_rate=1gbit
nproc=2
port=29400
subnet=10.77.0
log_dir=""
stats_file=""
timeout_s=1800
build="$root/build"
insecure=0
token_file=""
job_id=""
capture=""
hook=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) rate=${2:?--rate needs a value}; shift 2 ;;
    --nodes) nodes=${2:?--nodes needs a value}; shift 2 ;;
    --racks) racks=${2:?--racks needs a value}; shift 2 ;;
    --rack-rate) rack_rate=${2:?--rack-rate needs a value}; shift 2 ;;
    --nproc-per-node) nproc=${2:?--nproc-per-node needs a value}; shift 2 ;;
    --port) port=${2:?--port needs a value}; shift 2 ;;
    --subnet) subnet=${2:?--subnet needs a value}; shift 2 ;;
    --log-dir) log_dir=${2:?--log-dir needs a value}; shift 2 ;;
    --stats) stats_file=${2:?--stats needs a value}; shift 2 ;;
    --timeout) timeout_s=${2:?--timeout needs a value}; shift 2 ;;
    --build) build=${2:?--build needs a value}; shift 2 ;;
    --insecure) insecure=1; shift ;;
    --token-file) token_file=${2:?--token-file needs a value}; shift 2 ;;
    --job-id) job_id=${2:?--job-id needs a value}; shift 2 ;;
    --capture) capture=${2:?--capture needs a value}; shift 2 ;;
    --hook) hook=${2:?--hook needs a value}; shift 2 ;;
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
for flag in rate rack_rate; do
  value=${!flag}
  [[ $value == none || $value =~ ^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit)$ ]] ||
    die "--${flag/_/-} '$value' is not 'none' or a tc rate like 100mbit, 1gbit" 2
done
[[ $racks == 1 || $racks == 2 ]] || die "--racks '$racks' must be 1 or 2" 2
if ! [[ $nodes =~ ^[1-9][0-9]*$ ]] || [ "$nodes" -lt 2 ] || [ "$nodes" -gt 64 ]; then
  die "--nodes '$nodes' is not an integer in [2, 64]" 2
fi
[ "$racks" -eq 2 ] || [ "$nodes" -eq 2 ] ||
  die "--nodes $nodes needs --racks 2 (one rack is emulated only as 2 nodes on a veth pair)" 2
[ $((nodes % racks)) -eq 0 ] || die "--nodes $nodes is not a multiple of --racks $racks" 2
if [ -n "$token_file" ]; then
  [ "$insecure" -eq 0 ] || die "--token-file with --insecure: plain TCP uses no token" 2
  [ -r "$token_file" ] || die "--token-file '$token_file' is not a readable file" 2
  token_file=$(realpath "$token_file")
fi
[[ -z $job_id || $job_id =~ ^[A-Za-z0-9._-]+$ ]] ||
  die "--job-id '$job_id' must be letters, digits, '.', '_' or '-'" 2
if [ -n "$capture" ]; then
  [ "$racks" -eq 1 ] || die "--capture needs --racks 1 (it records node 1's end of the link)" 2
  command -v tcpdump >/dev/null || die "--capture needs tcpdump (Debian package tcpdump)"
  : >"$capture" || die "--capture '$capture' cannot be written"
  capture=$(realpath "$capture")
fi

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
ns=()
addr=()
for k in $(seq 0 $((nodes - 1))); do
  ns+=("${tag}n$k")
  addr+=("$subnet.$((k + 1))")
done
switch_ns=""  # --racks 2: the namespace with the bridges and the inter-rack link
[ -n "$job_id" ] || job_id="emu-$$-$(date +%s)"
work=$(mktemp -d "/tmp/${tag}.XXXXXX")
agent_pids=()
server_pid=""
capture_pid=""

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
  [ -n "$capture_pid" ] && stop_pids 5 "$capture_pid"
  for n in "${ns[@]}" $switch_ns; do
    ip netns pids "$n" 2>/dev/null | while read -r pid; do
      kill -KILL "$pid" 2>/dev/null || true
    done
    ip netns del "$n" 2>/dev/null || true  # also removes the veth pairs and bridges
  done
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "emulated_cluster: interrupted, stopping the job" >&2; exit 130' INT
trap 'echo "emulated_cluster: terminated, stopping the job" >&2; exit 143' TERM

# Limits what namespace $1 sends on device $2 to rate $3 ('none': no limit).
limit_rate() {
  [ "$3" = none ] && return 0
  # burst: 10 ms at the rate (at least 32 KiB), enough for tbf to reach the rate at HZ=250.
  local burst
  burst=$(awk -v r="$3" 'BEGIN {
    m = 1; if (r ~ /gbit$/) m = 1e9; else if (r ~ /mbit$/) m = 1e6; else if (r ~ /kbit$/) m = 1e3;
    sub(/[a-z]+$/, "", r); b = r * m / 8 / 100; if (b < 32768) b = 32768; printf "%d", b }')
  tc -n "$1" qdisc add dev "$2" root tbf rate "$3" burst "$burst" latency 100ms
}
add_ns() {
  ip netns add "$1" 2>"$work/err" || die "cannot create network namespace $1: $(cat "$work/err")" 77
  ip -n "$1" link set lo up
}

# ---- nodes and links ----
for k in $(seq 0 $((nodes - 1))); do add_ns "${ns[$k]}"; done
if [ "$racks" -eq 1 ]; then
  ip link add veth0 netns "${ns[0]}" type veth peer name veth1 netns "${ns[1]}"
  for k in 0 1; do
    ip -n "${ns[$k]}" addr add "${addr[$k]}/24" dev "veth$k"
    ip -n "${ns[$k]}" link set "veth$k" up
    limit_rate "${ns[$k]}" "veth$k" "$rate"
  done
  link_bytes() {  # bytes sent by node $1 on its end of the link
    ip netns exec "${ns[$1]}" cat "/sys/class/net/veth$1/statistics/tx_bytes"
  }
else
  # Switch namespace: bridge brR per rack R; port pK of node K's link, xR the end of the
  # inter-rack link on rack R's side. Each node sees one device, veth0.
  switch_ns="${tag}sw"
  add_ns "$switch_ns"
  ip netns exec "$switch_ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
  ip -n "$switch_ns" link add x0 type veth peer name x1
  for r in 0 1; do
    ip -n "$switch_ns" link add "br$r" type bridge
    ip -n "$switch_ns" link set "x$r" master "br$r"
    limit_rate "$switch_ns" "x$r" "$rate"
    ip -n "$switch_ns" link set "x$r" up
    ip -n "$switch_ns" link set "br$r" up
  done
  for k in $(seq 0 $((nodes - 1))); do
    ip link add veth0 netns "${ns[$k]}" type veth peer name "p$k" netns "$switch_ns"
    ip -n "$switch_ns" link set "p$k" master "br$((k / (nodes / 2)))"
    ip -n "$switch_ns" link set "p$k" up
    limit_rate "$switch_ns" "p$k" "$rack_rate"
    ip -n "${ns[$k]}" addr add "${addr[$k]}/24" dev veth0
    ip -n "${ns[$k]}" link set veth0 up
    limit_rate "${ns[$k]}" veth0 "$rack_rate"
  done
  link_bytes() {  # bytes sent from rack $1 to the other rack over the inter-rack link
    ip netns exec "$switch_ns" cat "/sys/class/net/x$1/statistics/tx_bytes"
  }
fi

# ---- the job's token, and the rendezvous server on node 0 ----
# The token goes to every process through a 0600 file, never a command line (docs/security.md).
if [ "$insecure" -eq 1 ]; then
  security=(--insecure)
elif [ -n "$token_file" ]; then
  security=(--token-file "$token_file")
else
  (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/token")
  security=(--token-file "$work/token")
fi
if [ -n "$capture" ]; then
  # -U: every packet reaches the file as it is captured; -B: a 32 MiB kernel buffer, so that a
  # busy machine drops fewer packets (the count is printed at the end); -Z root: Debian's tcpdump
  # would otherwise write as user tcpdump, which cannot write into a caller's private directory.
  ip netns exec "${ns[1]}" tcpdump -i veth1 -n -U -B 32768 -Z root -w "$capture" \
    2>"$work/tcpdump.log" &
  capture_pid=$!
  for _ in $(seq 100); do
    grep -q 'listening on' "$work/tcpdump.log" && break
    kill -0 "$capture_pid" 2>/dev/null || die "tcpdump exited: $(cat "$work/tcpdump.log")"
    sleep 0.1
  done
  grep -q 'listening on' "$work/tcpdump.log" ||
    die "tcpdump did not start capturing within 10 s: $(cat "$work/tcpdump.log")"
fi
ip netns exec "${ns[0]}" "$rendezvous" --host "${addr[0]}" --port "$port" "${security[@]}" \
  >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do
  grep -q '^listening on' "$work/server.log" && break
  kill -0 "$server_pid" 2>/dev/null || die "hsgd-rendezvous exited: $(cat "$work/server.log")"
  sleep 0.1
done
grep -q '^listening on' "$work/server.log" ||
  die "hsgd-rendezvous did not listen on ${addr[0]}:$port within 10 s: $(cat "$work/server.log")"

if [ "$racks" -eq 1 ]; then
  echo "emulated_cluster: 2 nodes x $nproc workers, link ${addr[0]} <-> ${addr[1]} at $rate" \
    "each way, rendezvous ${addr[0]}:$port, job $job_id" >&2
else
  echo "emulated_cluster: 2 racks x $((nodes / 2)) nodes x $nproc workers (${addr[0]}..." \
    "${addr[$((nodes - 1))]}), $rack_rate within a rack and $rate between the racks each way," \
    "rendezvous ${addr[0]}:$port, job $job_id" >&2
fi
if [ -n "$hook" ]; then
  hook_rc=0
  EMU_NAMESPACES="${ns[*]}" EMU_ADDRS="${addr[*]}" EMU_PORT=$port EMU_JOB_ID=$job_id \
    timeout "$timeout_s" bash -c "$hook" || hook_rc=$?
  [ "$hook_rc" -eq 0 ] || die "--hook exited $hook_rc"
fi
bytes0_start=$(link_bytes 0)
bytes1_start=$(link_bytes 1)
job_start_s=$(date +%s.%N)

# ---- one agent per node ----
for k in $(seq 0 $((nodes - 1))); do
  log_args=()
  [ -n "$log_dir" ] && log_args=(--log-dir "$log_dir/node$k")
  ip netns exec "${ns[$k]}" "$run" --nnodes "$nodes" --node-rank "$k" --nproc-per-node "$nproc" \
    --rdzv-endpoint "${addr[0]}:$port" --rdzv-id "$job_id" --rdzv-timeout 60 \
    "${security[@]}" "${log_args[@]}" -- "$@" &
  agent_pids+=($!)
done

# Waits for all agents; an agent that fails makes the other stop its workers too (hsgd-run's
# own protocol), so a short grace after the first exit is enough.
deadline=$(( $(date +%s) + timeout_s ))
rc=0
declare -A exited=()
while [ ${#exited[@]} -lt "$nodes" ]; do
  for k in $(seq 0 $((nodes - 1))); do
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
  [ ${#exited[@]} -lt "$nodes" ] && sleep 0.2
done
agent_pids=()
if [ -n "$capture_pid" ]; then
  # SIGINT: tcpdump writes what it holds and prints its counts.
  kill -INT "$capture_pid" 2>/dev/null || true
  wait "$capture_pid" 2>/dev/null || true
  capture_pid=""
  captured=$(sed -nE 's/^([0-9]+) packets? captured.*/\1/p' "$work/tcpdump.log")
  dropped=$(sed -nE 's/^([0-9]+) packets? dropped by kernel.*/\1/p' "$work/tcpdump.log")
  echo "emulated_cluster: capture $capture: ${captured:-?} packets captured," \
    "${dropped:-?} dropped by the kernel" >&2
fi

job_s=$(awk -v a="$job_start_s" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
bytes01=$(( $(link_bytes 0) - bytes0_start ))
bytes10=$(( $(link_bytes 1) - bytes1_start ))
if [ "$racks" -eq 1 ]; then
  echo "emulated_cluster: exit code $rc after $job_s s; bytes across the link:" \
    "node0->node1 $bytes01, node1->node0 $bytes10" >&2
else
  echo "emulated_cluster: exit code $rc after $job_s s; bytes across the inter-rack link:" \
    "rack0->rack1 $bytes01, rack1->rack0 $bytes10" >&2
fi
if [ -n "$stats_file" ]; then
  {
    echo "rate=$rate"
    echo "nproc_per_node=$nproc"
    echo "exit_code=$rc"
    echo "seconds=$job_s"
    if [ "$racks" -eq 1 ]; then
      echo "bytes_node0_to_node1=$bytes01"
      echo "bytes_node1_to_node0=$bytes10"
    else
      echo "nodes=$nodes"
      echo "rack_rate=$rack_rate"
      echo "bytes_rack0_to_rack1=$bytes01"
      echo "bytes_rack1_to_rack0=$bytes10"
    fi
    # Per node, its kernel's TCP loss recovery over the job (segments sent again, retransmission
    # timeouts, tail loss probes, fast retransmits), and the packets its rate limit dropped.
    for k in $(seq 0 $((nodes - 1))); do
      ip netns exec "${ns[$k]}" nstat -asz TcpRetransSegs TcpExtTCPTimeouts TcpExtTCPLossProbes \
        TcpExtTCPFastRetrans 2>/dev/null | awk -v k="$k" '
          $1 == "TcpRetransSegs" { print "node" k "_tcp_retrans_segs=" $2 }
          $1 == "TcpExtTCPTimeouts" { print "node" k "_tcp_timeouts=" $2 }
          $1 == "TcpExtTCPLossProbes" { print "node" k "_tcp_loss_probes=" $2 }
          $1 == "TcpExtTCPFastRetrans" { print "node" k "_tcp_fast_retrans=" $2 }'
      dev=veth0
      [ "$racks" -eq 1 ] && dev=veth$k
      echo "node${k}_qdisc_dropped=$(tc -s -n "${ns[$k]}" qdisc show dev "$dev" |
        sed -nE 's/.*dropped ([0-9]+).*/\1/p' | head -1)"
    done
  } >"$stats_file"
fi
exit "$rc"
