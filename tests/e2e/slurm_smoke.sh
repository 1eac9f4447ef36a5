#!/usr/bin/env bash
# Usage: slurm_smoke.sh SOURCE_DIR BUILD_DIR
# hsgd under a real Slurm: starts a one-node cluster on this machine (Debian's munged, slurmctld
# and slurmd as root, a generated slurm.conf in a temporary directory: proctrack/linuxproc,
# task/none, the node's CPUs as slurmd -C reports them, OverSubscribe; private ports and munge
# socket, job ids starting at a random number so that concurrent runs use different rendezvous
# ports) and runs through it:
#   1. srun -n 4 --overcommit train_mlp --mode hierarchical --hierarchy 2:2,4:4: task r is rank r
#      of 4 (Slurm's variables, no RANK), allreduces over shared memory, its intra-node group is
#      the 4 ranks of the node (SLURM_STEP_TASKS_PER_NODE), both levels averaged, accuracy line;
#   2. srun --ntasks-per-node=1 hsgd-run --nproc-per-node 2: one node of 2 workers, hsgd-run's
#      node count, rank, endpoint and job id from Slurm;
#   3. srun -n 2 hsgd-run --nproc-per-node 2: two hsgd-runs (two emulated nodes), node 1 finds
#      the rendezvous server that node 0's hsgd-run hosts;
#   4. both sbatch examples of scripts/slurm/.
# Installs slurmctld, slurmd, slurm-client and munge with apt-get when they are missing (root).
# Exit 77 (skip), saying why, when not root, when they cannot be installed, or when the daemons do
# not start. The daemons are stopped by pid and the directory removed on exit, whatever happens.
set -euo pipefail
src=$1
build=$2

skip() { echo "slurm_smoke: skipped: $1"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root to run munged, slurmctld and slurmd"

packages=(slurmctld slurmd slurm-client munge)
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
   ! command -v srun >/dev/null || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || skip "Slurm is not installed and there is no apt-get"
  echo "slurm_smoke: installing ${packages[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! timeout 90 apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null; then
    timeout 45 apt-get update -qq >/dev/null 2>&1 || true
    timeout 90 apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null ||
      skip "apt-get could not install ${packages[*]}"
  fi
fi

host=$(hostname -s)
getent hosts "$host" >/dev/null ||
  skip "this machine's name '$host' does not resolve, so Slurm's node list cannot name it"

# Nothing of an outer job or launcher may leak into the tasks.
while read -r var; do unset "$var"; done < <(compgen -e | grep -E '^(SLURM_|SBATCH_|SRUN_|SALLOC_)' || true)
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT HSGD_RUN_ID \
  HSGD_NNODES HSGD_NODE_RANK HSGD_RDZV_ENDPOINT HSGD_RDZV_ID HSGD_NPROC_PER_NODE HSGD_STANDALONE

dir=$(mktemp -d /tmp/hsgd-slurm.XXXXXX)
chmod 755 "$dir"  # tasks reach the munge socket inside
pids=()
cleanup() {
  local rc=$?
  if [ -n "${SLURM_CONF:-}" ] && [ ${#pids[@]} -ge 2 ]; then
    scancel --quiet --user=root >/dev/null 2>&1 || true
    for _ in $(seq 50); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$dir"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Two free TCP ports for slurmctld and slurmd.
free_port() {
  local port
  while :; do
    port=$((40000 + RANDOM % 20000))
    [ "$port" -ne "${1:-0}" ] || continue
    [ -z "$(ss -Htln "sport = :$port" 2>/dev/null)" ] && { echo "$port"; return; }
  done
}
ctld_port=$(free_port)
slurmd_port=$(free_port "$ctld_port")
# Job ids decide the rendezvous ports (comm/process_group/slurm_env.h): start at a random one.
first_job=$((1000 * (1 + RANDOM % 900) + RANDOM % 900))

node=$(slurmd -C 2>/dev/null | head -1 | grep -o 'CPUs=[0-9]*') || skip "slurmd -C failed"
mkdir -p "$dir/state" "$dir/spool"
head -c 1024 /dev/urandom >"$dir/munge.key"
chmod 400 "$dir/munge.key"
cat >"$dir/slurm.conf" <<EOF
ClusterName=hsgdsmoke
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
ReturnToService=2
FirstJobId=$first_job
KillWait=2
NodeName=$host NodeAddr=127.0.0.1 $node State=UNKNOWN
PartitionName=smoke Nodes=$host Default=YES MaxTime=5 State=UP OverSubscribe=FORCE:4
EOF
export SLURM_CONF=$dir/slurm.conf

munged -F -f --socket="$dir/munge.sock" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
  --seed-file="$dir/munged.seed" --log-file="$dir/munged.log" >"$dir/munged.out" 2>&1 &
pids+=($!)
slurmctld -D -c -f "$SLURM_CONF" >"$dir/slurmctld.log" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" -N "$host" >"$dir/slurmd.log" 2>&1 &
pids+=($!)

ready=0
for _ in $(seq 100); do
  if sinfo -h -N -o %T 2>/dev/null | grep -Eq '^idle'; then ready=1; break; fi
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null || break 2; done
  sleep 0.2
done
if [ "$ready" -ne 1 ]; then
  tail -n 5 "$dir"/munged.out "$dir"/slurmctld.log "$dir"/slurmd.log || true
  skip "the Slurm daemons did not start (logs above)"
fi
echo "slurm_smoke: one-node cluster up ($node, slurmctld port $ctld_port, first job $first_job)"

out=$dir/out
fail() { cat "$out"; echo "slurm_smoke: FAILED: $1" >&2; exit 1; }
expect() { grep -Eq -- "$1" "$out" || fail "$2 (no line matching '$1')"; }
accuracy='final test accuracy: (9[0-9]|100)\.'
mlp=("$build/apps/train_mlp/train_mlp" --synthetic --epochs 1)

# 1. Four workers started by srun alone: every task takes its place from Slurm's variables.
rc=0
HSGD_LOG_LEVEL=debug timeout 60 srun -t 2 -n 4 --overcommit --label --kill-on-bad-exit=1 \
  "${mlp[@]}" --mode hierarchical --hierarchy 2:2,4:4 >"$out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "srun -n 4 train_mlp: exit code $rc, expected 0"
for r in 0 1 2 3; do
  expect "^ *$r: .*rank $r of group 'world' connected \(4 ranks, .*allreduce over shared memory\)" \
    "task $r is not rank $r of 4 over shared memory"
  expect "^ *$r: .*rank $r: local SGD starts after 0 iterations \(subgroup of 4 ranks\)" \
    "the intra-node group of task $r is not the 4 ranks of the node"
done
expect "^ *0: $accuracy" "no final test accuracy >= 90% from rank 0"
expect '^ *0: model averaging level: +2 +2 +[1-9][0-9]* ' "level 2:2 never averaged"
expect '^ *0: model averaging level: +4 +4 +[1-9][0-9]* ' "level 4:4 never averaged"
echo "slurm_smoke: srun -n 4 train_mlp passed"

# 2. One hsgd-run per node (one node here), its flags from Slurm.
rc=0
HSGD_LOG_LEVEL=debug timeout 60 srun -t 2 -N 1 --ntasks-per-node=1 --label \
  "$build/apps/hsgd-run/hsgd-run" --nproc-per-node 2 -- "${mlp[@]}" --mode hierarchical \
  --hierarchy 2:2 >"$out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "srun hsgd-run: exit code $rc, expected 0"
expect "^ *0: .*job 'slurm-[0-9]+\.0' attempt 0: this is node 0 of 1, world size 2" \
  "hsgd-run did not take its job id and node count from Slurm"
expect "^ *0: \[rank 1\] .*rank 1 of group 'world' connected \(2 ranks" "worker rank 1 missing"
expect "^ *0: \[rank 0\] $accuracy" "no final test accuracy >= 90% from rank 0"
echo "slurm_smoke: srun --ntasks-per-node=1 hsgd-run passed"

# 3. Two hsgd-runs: node ranks from SLURM_PROCID, node 1 meets node 0's server.
rc=0
timeout 60 srun -t 2 -n 2 --overcommit --label --kill-on-bad-exit=1 \
  "$build/apps/hsgd-run/hsgd-run" --nproc-per-node 2 -- "${mlp[@]}" --mode hierarchical \
  --hierarchy 2:2,4:4 >"$out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "srun -n 2 hsgd-run: exit code $rc, expected 0"
expect "^ *0: .*this is node 0 of 2, world size 4" "task 0 is not node 0 of 2"
expect "^ *1: .*this is node 1 of 2, world size 4" "task 1 is not node 1 of 2"
expect "^ *1: .*all 2 workers of node 1 exited 0" "node 1's workers did not finish"
expect "^ *0: \[rank 0\] $accuracy" "no final test accuracy >= 90% from rank 0"
echo "slurm_smoke: srun -n 2 hsgd-run passed"

# 4. The sbatch examples (one node: 2 tasks of one CPU; one hsgd-run of 2 workers).
run_batch() {  # run_batch SCRIPT SBATCH_OPTIONS... -- ARGS...: waits; fails on a non-zero exit
  local script=$1 id state code
  shift
  local opts=()
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  id=$(sbatch --parsable -t 2 -o "$out" "${opts[@]}" "$script" "$@") ||
    fail "sbatch $script was refused"
  for _ in $(seq 300); do
    state=$(scontrol -o show job "$id" | grep -o 'JobState=[A-Z_]*' || true)
    case "$state" in JobState=PENDING | JobState=RUNNING | JobState=CONFIGURING | \
      JobState=COMPLETING | "") sleep 0.2 ;; *) break ;; esac
  done
  code=$(scontrol -o show job "$id" | grep -o ' ExitCode=[0-9:]*' || true)
  [ "$state" = JobState=COMPLETED ] && [ "$code" = " ExitCode=0:0" ] ||
    fail "sbatch $script: $state$code, expected JobState=COMPLETED ExitCode=0:0"
}
export HSGD_APPS=$build/apps
run_batch "$src/scripts/slurm/srun_workers.sbatch" -N 1 --ntasks-per-node=2 -- \
  "${mlp[@]:1}" --mode hierarchical --hierarchy 2:2
expect "^train_mlp: 2 ranks, mode hierarchical" "srun_workers.sbatch did not run 2 ranks"
expect "^$accuracy" "srun_workers.sbatch: no final test accuracy >= 90%"
run_batch "$src/scripts/slurm/hsgd_run_per_node.sbatch" -N 1 --cpus-per-task=2 -- \
  "${mlp[@]:1}" --mode ddp
expect "this is node 0 of 1, world size 2" "hsgd_run_per_node.sbatch did not run 2 workers"
expect "^\[rank 0\] $accuracy" "hsgd_run_per_node.sbatch: no final test accuracy >= 90%"
echo "slurm_smoke: the sbatch examples passed"
echo "slurm_smoke: passed"
