#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2015,SC2016  # functions run from traps; A && B || C on tests; sh -c
# A real multi-node Slurm cluster on this machine, for tests and for trying sbatch scripts.
#
# Sourced by a test (bash, set -euo pipefail is fine):
#   source tests/e2e/slurm_cluster.sh
#   trap 'slurm_cluster_stop' EXIT
#   slurm_cluster_prepare "my_test"   # exit 77, saying why, without root, namespaces or packages
#   slurm_cluster_start 4             # SLURM_CONF exported; sbatch, srun, squeue, ... work
#   ...                               # SC_NODES[k], SC_ADDRS[k], SC_NS[k]
#   slurm_cluster_link_bytes 1        # "TX RX": bytes node 1 sent and received on its link
#   slurm_cluster_stop                # idempotent; also what the EXIT trap runs
# Run directly, it starts a cluster, runs COMMAND with SLURM_CONF set and stops the cluster:
#   tests/e2e/slurm_cluster.sh --nodes 2 -- bash
#
# What it makes (names carry the tag hsgdsl<PID of the shell>, so concurrent clusters and the
# leftovers of a killed one are told apart):
#   - a switch network namespace <tag>sw with a bridge br0;
#   - per node k a network namespace <tag>n<k> whose eth0 (A.B.C.(k+1)/24) is a veth to port
#     p<k> of the bridge: the node's link, whose counters say what the node sent and received;
#   - a veth <tag>h from the root namespace to the bridge with A.B.C.254, where slurmctld and the
#     client commands run (A.B.C is a free 10.79.x);
#   - lines "ADDRESS NAME # <tag>" in /etc/hosts for the nodes, so that names resolve in every
#     namespace (hsgd's workers look up the step's first host);
#   - its own munged on a private socket (AuthInfo=socket=...), so the system's munged is left
#     alone; slurmctld (root namespace, on a free port outside the kernel's ephemeral range: see
#     sc_pick_port); per node one slurmd -N <tag>n<k>, started with
#     `nsenter --net=/run/netns/NS unshare --uts` and the node name as host name. (`ip netns
#     exec` would remount /sys and hide the cgroup tree slurmd needs: "Unable to initialize
#     cgroup plugin".)
# Each node declares the CPUs slurmd -C finds (all nodes share this machine's cores); proctrack
# linuxproc, task/none; jobs up to 60 minutes; EnforcePartLimits=ALL, so that an impossible
# request fails at once instead of waiting forever; the partition oversubscribes up to 4 jobs per
# CPU.
#
# The nodes share this machine's file systems (/dev/shm, /tmp) and process table, like containers
# on one host; only their network and host name are their own.
#
# Stopping: jobs cancelled, daemons stopped by their pid files (SIGTERM, SIGKILL after 5 s),
# processes left in the node namespaces killed, namespaces deleted (which deletes the veths and
# the bridge), /etc/hosts lines removed, directory removed. slurm_cluster_start first reaps what a
# killed earlier cluster (its shell no longer running) left behind, by the same tag and pid files.

sc_log() { echo "${SC_WHO:-slurm_cluster}: $*" >&2; }
sc_skip() { echo "${SC_WHO:-slurm_cluster}: skipped: $1"; exit 77; }

SC_TAG="hsgdsl$$"
SC_DIR=""
SC_SUBNET=""
SC_NODES=()
SC_ADDRS=()
SC_NS=()
SC_SWITCH=""
SC_PIDS=()

# Checks that a cluster can be made here: root, network namespaces, nsenter/unshare, and the
# Slurm and munge packages (installed with apt-get when missing). Exit 77 naming what is missing.
slurm_cluster_prepare() {
  SC_WHO=${1:-slurm_cluster}
  [ "$(id -u)" -eq 0 ] || sc_skip "needs root (network namespaces, munged, slurmctld, slurmd)"
  local tool
  for tool in ip nsenter unshare flock; do
    command -v "$tool" >/dev/null || sc_skip "needs '$tool' (iproute2, util-linux)"
  done
  local probe="hsgdslprobe$$"
  ip netns add "$probe" 2>/dev/null || sc_skip "cannot create network namespaces (ip netns add)"
  ip netns del "$probe"
  local packages=(slurmctld slurmd slurm-client munge)
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
    ! command -v srun >/dev/null || ! command -v munged >/dev/null; then
    command -v apt-get >/dev/null || sc_skip "Slurm is not installed and there is no apt-get"
    sc_log "installing ${packages[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! timeout 90 apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null; then
      timeout 45 apt-get update -qq >/dev/null 2>&1 || true
      timeout 90 apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null ||
        sc_skip "apt-get could not install ${packages[*]}"
    fi
  fi
  # Nothing of an outer job or launcher may leak into the cluster's jobs.
  local var
  while read -r var; do unset "$var"; done < <(
    compgen -e | grep -E '^(SLURM_|SBATCH_|SRUN_|SALLOC_)' || true
  )
  unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT \
    HSGD_RUN_ID HSGD_NNODES HSGD_NODE_RANK HSGD_RDZV_ENDPOINT HSGD_RDZV_ID HSGD_NPROC_PER_NODE \
    HSGD_STANDALONE
}

# Runs "$@" holding the lock that serialises edits of /etc/hosts and the choice of subnets.
sc_locked() {
  (
    flock -w 30 9 || { sc_log "could not lock /etc/hosts within 30 s"; exit 1; }
    "$@"
  ) 9</etc/hosts
}

# Rewrites /etc/hosts in place without the lines tagged with any of "$@" (in place: the file may
# be a bind mount, which a rename would not replace).
sc_hosts_drop() {
  local content tag pattern=""
  for tag in "$@"; do pattern+="${pattern:+|}# $tag\$"; done
  grep -Eq "$pattern" /etc/hosts || return 0
  content=$(grep -Ev "$pattern" /etc/hosts || true)
  printf '%s\n' "$content" >/etc/hosts
}

sc_alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# Stops pids "$@": SIGTERM, up to 5 s, then SIGKILL.
sc_stop_pids() {
  local pid alive
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 50); do
    alive=0
    for pid in "$@"; do sc_alive "$pid" && alive=1; done
    [ "$alive" -eq 0 ] && return 0
    sleep 0.1
  done
  for pid in "$@"; do kill -KILL "$pid" 2>/dev/null || true; done
}

# Kills what is left in network namespace $1 and deletes it.
sc_drop_netns() {
  local pid
  for pid in $(ip netns pids "$1" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
  for _ in $(seq 20); do
    [ -z "$(ip netns pids "$1" 2>/dev/null)" ] && break
    sleep 0.1
  done
  ip netns del "$1" 2>/dev/null || true
}

# Removes what clusters whose shell no longer runs left behind: daemons named in their pid files
# (only if the pid still is that daemon), namespaces, /etc/hosts lines, directories.
sc_reap() {
  local ns owner dir pidfile pid comm dead_tags=()
  for ns in $(ip netns list | awk '{print $1}' | grep -E '^hsgdsl[0-9]+(n[0-9]+|sw)$' || true); do
    owner=${ns#hsgdsl}
    owner=${owner%%[ns]*}
    sc_alive "$owner" || dead_tags+=("hsgdsl$owner")
  done
  for dir in /tmp/hsgd-slurm-*; do
    [ -d "$dir" ] || continue
    owner=${dir#/tmp/hsgd-slurm-}
    owner=${owner%%.*}
    [[ $owner =~ ^[0-9]+$ ]] || continue
    sc_alive "$owner" && continue
    dead_tags+=("hsgdsl$owner")
    for pidfile in "$dir"/*.pid; do
      [ -f "$pidfile" ] || continue
      pid=$(cat "$pidfile" 2>/dev/null || true)
      [[ $pid =~ ^[0-9]+$ ]] || continue
      comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
      case "$comm" in munged | slurmctld | slurmd) kill -KILL "$pid" 2>/dev/null || true ;; esac
    done
    rm -rf "$dir"
  done
  for owner in $(grep -Eo '# hsgdsl[0-9]+$' /etc/hosts | grep -Eo '[0-9]+$' | sort -u || true); do
    sc_alive "$owner" || dead_tags+=("hsgdsl$owner")
  done
  [ ${#dead_tags[@]} -gt 0 ] || return 0
  mapfile -t dead_tags < <(printf '%s\n' "${dead_tags[@]}" | sort -u)
  sc_log "removing what killed clusters left behind: ${dead_tags[*]}"
  for ns in $(ip netns list | awk '{print $1}'); do
    for owner in "${dead_tags[@]}"; do
      [[ $ns =~ ^${owner}(n[0-9]+|sw)$ ]] && sc_drop_netns "$ns"
    done
  done
  sc_locked sc_hosts_drop "${dead_tags[@]}"
}

# Picks a free 10.79.x.0/24 (no address of the root namespace in it, no other cluster's) and
# writes the /etc/hosts lines of nodes $2.. with it; prints the subnet. Runs under sc_locked.
sc_claim_subnet() {
  local tag=$1 n=$2 x subnet k
  for x in $(shuf -i 1-250); do
    subnet="10.79.$x"
    ip -4 -o addr show | grep -q " $subnet\." && continue
    grep -q "^$subnet\." /etc/hosts && continue
    for k in $(seq 0 $((n - 1))); do
      printf '%s\t%s # %s\n' "$subnet.$((k + 1))" "${tag}n$k" "$tag" >>/etc/hosts
    done
    echo "$subnet"
    return 0
  done
  return 1
}

sc_fail_start() {
  local f
  for f in "$SC_DIR"/*.log "$SC_DIR"/*.out; do
    [ -f "$f" ] && { echo "--- $f"; tail -n 8 "$f"; }
  done >&2
  sc_log "FAILED: $1"
  exit 1
}

# Prints a port for slurmctld that no socket can hold: outside the kernel's ephemeral range
# (/proc/sys/net/ipv4/ip_local_port_range, where outgoing connections and bind(0) take theirs,
# so another test's connection can hold any port inside it at any moment) and used by no socket
# in any state (ss -a: listening, connected, TIME-WAIT). Above the range when it leaves 1000 ports
# there (61000-65535 by default), else below it. Fails when 200 draws found nothing.
sc_pick_port() {
  local lo=32768 hi=60999 first last port
  read -r lo hi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
  if [ $((65535 - hi)) -ge 1000 ]; then
    first=$((hi + 1)) last=65535
  elif [ $((lo - 10000)) -ge 1000 ]; then
    first=10000 last=$((lo - 1))
  else
    return 1
  fi
  for _ in $(seq 200); do
    port=$((first + (RANDOM * 32768 + RANDOM) % (last - first + 1)))
    [ -z "$(ss -Htan "sport = :$port" 2>/dev/null)" ] && { echo "$port"; return 0; }
  done
  return 1
}

# Starts slurmctld with the SlurmctldPort of $SLURM_CONF set to $1 and returns once it listens
# there (its pid appended to SC_PIDS). It listens on SlurmctldPort only (Slurm 22.05, seen with
# ss -tlnp); slurmd listens in the node namespaces, srun on ephemeral ports. sc_pick_port's check
# and slurmctld's bind are not atomic: another cluster starting at the same moment, or any
# program binding that port explicitly, can take it in between. Then slurmctld exits with
# "Address already in use" and starts again on another port (up to 5 ports), SLURM_CONF
# rewritten before any slurmd reads it.
sc_start_slurmctld() {
  local port=$1 try pid
  for try in 1 2 3 4 5; do
    sed -i "s/^SlurmctldPort=.*/SlurmctldPort=$port/" "$SLURM_CONF"
    slurmctld -D -f "$SLURM_CONF" >"$SC_DIR/slurmctld.out" 2>&1 &
    pid=$!
    for _ in $(seq 300); do
      if ss -Htlnp "sport = :$port" 2>/dev/null | grep -q "pid=$pid,"; then
        SC_PIDS+=("$pid")
        return 0
      fi
      sc_alive "$pid" || break
      sleep 0.1
    done
    if sc_alive "$pid"; then
      SC_PIDS+=("$pid")
      sc_fail_start "slurmctld (pid $pid) does not listen on port $port after 30 s"
    fi
    wait "$pid" 2>/dev/null || true
    cat "$SC_DIR/slurmctld.log" "$SC_DIR/slurmctld.out" 2>/dev/null |
      grep -q 'Address already in use' ||
      sc_fail_start "slurmctld exited during start-up (logs above)"
    sc_log "port $port was taken when slurmctld bound it (try $try of 5); picking another"
    mv "$SC_DIR/slurmctld.log" "$SC_DIR/slurmctld-try$try.log" 2>/dev/null || true
    port=$(sc_pick_port) || sc_fail_start "no free port for slurmctld outside the ephemeral range"
  done
  sc_fail_start "slurmctld found its port taken 5 times"
}

# Starts a cluster of $1 nodes (1..64). Exports SLURM_CONF; fills SC_NODES, SC_ADDRS, SC_NS.
# Returns when every node is idle; exits 1 with the daemons' logs when they do not get there.
slurm_cluster_start() {
  local n=$1 k
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 64 ] ||
    { sc_log "node count '$n' is not an integer in [1, 64]"; exit 2; }
  sc_reap
  SC_DIR=$(mktemp -d "/tmp/hsgd-slurm-$$.XXXXXX")
  chmod 755 "$SC_DIR"  # tasks reach the munge socket and the configuration inside
  SC_SUBNET=$(sc_locked sc_claim_subnet "$SC_TAG" "$n") ||
    sc_fail_start "no free subnet 10.79.x.0/24 for the nodes"
  for k in $(seq 0 $((n - 1))); do
    SC_NODES+=("${SC_TAG}n$k")
    SC_ADDRS+=("$SC_SUBNET.$((k + 1))")
  done

  # ---- network: switch namespace with a bridge; one veth per node; one to the root namespace
  SC_SWITCH="${SC_TAG}sw"
  ip netns add "$SC_SWITCH"
  ip -n "$SC_SWITCH" link set lo up
  ip -n "$SC_SWITCH" link add br0 type bridge
  ip -n "$SC_SWITCH" link set br0 up
  ip link add "${SC_TAG}h" type veth peer name hostlink netns "$SC_SWITCH"
  ip -n "$SC_SWITCH" link set hostlink master br0
  ip -n "$SC_SWITCH" link set hostlink up
  ip addr add "$SC_SUBNET.254/24" dev "${SC_TAG}h"
  ip link set "${SC_TAG}h" up
  for k in $(seq 0 $((n - 1))); do
    SC_NS+=("${SC_NODES[$k]}")
    ip netns add "${SC_NS[$k]}"
    ip -n "${SC_NS[$k]}" link set lo up
    ip link add eth0 netns "${SC_NS[$k]}" type veth peer name "p$k" netns "$SC_SWITCH"
    ip -n "$SC_SWITCH" link set "p$k" master br0
    ip -n "$SC_SWITCH" link set "p$k" up
    ip -n "${SC_NS[$k]}" addr add "${SC_ADDRS[$k]}/24" dev eth0
    ip -n "${SC_NS[$k]}" link set eth0 up
  done

  # ---- configuration
  local ctld_port host cpus first_job
  ctld_port=$(sc_pick_port) ||
    sc_fail_start "no free port for slurmctld outside the ephemeral range"
  host=$(hostname -s)
  cpus=$(slurmd -C 2>/dev/null | head -1 | grep -o 'CPUs=[0-9]*') ||
    sc_fail_start "slurmd -C failed"
  # Job ids decide hsgd's default rendezvous ports; random ones keep concurrent clusters apart
  # even where a port is shared (a job's tasks all run inside the namespaces, though).
  first_job=$((1000 * (1 + RANDOM % 900) + RANDOM % 900))
  mkdir -p "$SC_DIR/state"
  head -c 1024 /dev/urandom >"$SC_DIR/munge.key"
  chmod 400 "$SC_DIR/munge.key"
  {
    cat <<EOF
ClusterName=hsgd
SlurmctldHost=$host($SC_SUBNET.254)
SlurmctldPort=$ctld_port
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$SC_DIR/munge.sock
CredType=cred/munge
StateSaveLocation=$SC_DIR/state
SlurmdSpoolDir=$SC_DIR/spool-%n
SlurmctldPidFile=$SC_DIR/slurmctld.pid
SlurmdPidFile=$SC_DIR/slurmd-%n.pid
SlurmctldLogFile=$SC_DIR/slurmctld.log
SlurmdLogFile=$SC_DIR/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
EnforcePartLimits=ALL
MailProg=/bin/true
ReturnToService=2
FirstJobId=$first_job
KillWait=2
EOF
    for k in $(seq 0 $((n - 1))); do
      echo "NodeName=${SC_NODES[$k]} NodeAddr=${SC_ADDRS[$k]} $cpus State=UNKNOWN"
    done
    echo "PartitionName=hsgd Nodes=ALL Default=YES MaxTime=60 State=UP OverSubscribe=FORCE:4"
  } >"$SC_DIR/slurm.conf"
  export SLURM_CONF=$SC_DIR/slurm.conf

  # ---- daemons
  munged -F -f --socket="$SC_DIR/munge.sock" --key-file="$SC_DIR/munge.key" \
    --pid-file="$SC_DIR/munged.pid" --seed-file="$SC_DIR/munged.seed" \
    --log-file="$SC_DIR/munged.log" >"$SC_DIR/munged.out" 2>&1 &
  SC_PIDS+=($!)
  for _ in $(seq 50); do [ -S "$SC_DIR/munge.sock" ] && break; sleep 0.1; done
  sc_start_slurmctld "$ctld_port"
  ctld_port=$(sed -n 's/^SlurmctldPort=//p' "$SLURM_CONF")
  for k in $(seq 0 $((n - 1))); do
    mkdir -p "$SC_DIR/spool-${SC_NODES[$k]}"
    # nsenter and unshare exec (no fork), so $! is the slurmd itself.
    nsenter --net="/run/netns/${SC_NS[$k]}" unshare --uts \
      sh -c 'hostname "$1" && exec slurmd -D -f "$2" -N "$1"' sh "${SC_NODES[$k]}" "$SLURM_CONF" \
      >"$SC_DIR/slurmd-${SC_NODES[$k]}.out" 2>&1 &
    SC_PIDS+=($!)
  done

  local idle pid
  for _ in $(seq 150); do
    idle=$(sinfo -h -N -o '%N %T' 2>/dev/null | grep -c ' idle$' || true)
    [ "$idle" -eq "$n" ] && break
    for pid in "${SC_PIDS[@]}"; do
      sc_alive "$pid" || sc_fail_start "a daemon (pid $pid) exited during start-up (logs above)"
    done
    sleep 0.2
  done
  [ "$idle" -eq "$n" ] ||
    sc_fail_start "$idle of $n nodes idle after 30 s: $(sinfo -h -N -o '%N %T' 2>&1 | tr '\n' ' ')"
  sc_log "$n node(s) up: ${SC_NODES[*]} on $SC_SUBNET.0/24 ($cpus each), slurmctld" \
    "$SC_SUBNET.254:$ctld_port, first job $first_job"
}

# Bytes node $1 sent and received on its link so far: "TX RX".
slurm_cluster_link_bytes() {
  local stats=/sys/class/net/eth0/statistics
  # ip netns exec mounts the namespace's own /sys for this one command (fine for reading).
  ip netns exec "${SC_NS[$1]}" sh -c "echo \$(cat $stats/tx_bytes) \$(cat $stats/rx_bytes)"
}

slurm_cluster_stop() {
  local rc=$? k pid
  [ -n "$SC_DIR" ] || return "$rc"
  trap '' INT TERM
  if [ ${#SC_PIDS[@]} -ge 2 ] && sc_alive "${SC_PIDS[1]}"; then
    scancel --quiet --user=root >/dev/null 2>&1 || true
    for _ in $(seq 50); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  # The daemons' own pid files, and the pids they were started as (the same processes).
  local pids=("${SC_PIDS[@]}")
  for pid in $(cat "$SC_DIR"/*.pid 2>/dev/null || true); do
    case "$(cat "/proc/$pid/comm" 2>/dev/null)" in
      munged | slurmctld | slurmd) pids+=("$pid") ;;
    esac
  done
  [ ${#pids[@]} -gt 0 ] && sc_stop_pids "${pids[@]}"
  for pid in "${SC_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  for k in "${!SC_NS[@]}"; do sc_drop_netns "${SC_NS[$k]}"; done
  [ -n "$SC_SWITCH" ] && sc_drop_netns "$SC_SWITCH"  # also deletes the root namespace's veth
  sc_locked sc_hosts_drop "$SC_TAG" || true
  rm -rf "$SC_DIR"
  SC_DIR=""
  SC_PIDS=()
  SC_NS=()
  SC_SWITCH=""
  return "$rc"
}

# ---- for tests that submit one job and follow it (slurm_preempt, slurm_elastic)
# slurm_job_test NAME DEADLINE: the EXIT/INT/TERM traps (the cluster stops; on failure, or with
# HSGD_KEEP_OUTPUT set, the job's output is kept as /tmp/NAME.PID.out), start_s and deadline_s
# (DEADLINE seconds from now; check_deadline exits 124 past it), the cluster prepared
# (slurm_cluster_prepare NAME, exit 77 when it cannot run) and `work`, a directory named like the
# cluster's (so that a later cluster removes it if this shell is killed) with `out` in it, for
# the job's output. job_field ID FIELD reads one field of `scontrol show job`.
slurm_job_test() {
  sj_name=$1
  work=""
  trap sj_finish EXIT
  trap 'echo "$sj_name: interrupted" >&2; exit 130' INT
  trap 'echo "$sj_name: terminated" >&2; exit 143' TERM
  start_s=$(date +%s)
  sj_deadline=$2
  deadline_s=$((start_s + sj_deadline))
  slurm_cluster_prepare "$sj_name"
  work=$(mktemp -d "/tmp/hsgd-slurm-$$.$sj_name.XXXXXX")
  chmod 755 "$work"
  out=$work/out
}

sj_finish() {
  local rc=$? f
  if [ "$rc" -ne 0 ] && [ -n "$SC_DIR" ]; then
    # What Slurm said, for a failure that its job state alone does not explain.
    for f in "$SC_DIR"/slurmctld.log "$SC_DIR"/slurmd-*.log; do
      [ -f "$f" ] && { echo "--- $f (last lines)"; tail -n 15 "$f"; }
    done >&2
  fi
  slurm_cluster_stop || true
  if [ -n "$work" ]; then
    if [ "$rc" -ne 0 ] || [ -n "${HSGD_KEEP_OUTPUT:-}" ]; then
      cp "$work/out" "/tmp/$sj_name.$$.out" 2>/dev/null &&
        echo "$sj_name: output kept in /tmp/$sj_name.$$.out" >&2
    fi
    rm -rf "$work"
  fi
  exit "$rc"
}

check_deadline() {
  [ "$(date +%s)" -lt "$deadline_s" ] && return 0
  echo "$sj_name: FAILED: still running after $sj_deadline s" >&2
  exit 124
}

job_field() { scontrol -o show job "$1" | grep -Eo " $2=[^ ]*" | cut -d= -f2 || true; }

# ---- run directly: slurm_cluster.sh [--nodes N] -- COMMAND [ARGS...]
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  nodes=2
  while [ $# -gt 0 ]; do
    case "$1" in
      --nodes) nodes=${2:?--nodes needs a value}; shift 2 ;;
      --) shift; break ;;
      -h | --help)
        echo "Usage: $0 [--nodes N] -- COMMAND [ARGS...]"
        echo "Starts an N-node Slurm cluster (default 2) on this machine, runs COMMAND with"
        echo "SLURM_CONF set (e.g. bash, or sbatch --wait SCRIPT), stops the cluster; root only."
        exit 0 ;;
      *) echo "slurm_cluster: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
  done
  [ $# -ge 1 ] || { echo "slurm_cluster: no COMMAND after -- (see --help)" >&2; exit 2; }
  trap 'slurm_cluster_stop' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  slurm_cluster_prepare slurm_cluster
  slurm_cluster_start "$nodes"
  rc=0
  "$@" || rc=$?
  exit "$rc"
fi
