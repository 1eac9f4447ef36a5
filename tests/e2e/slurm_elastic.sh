#!/usr/bin/env bash
# shellcheck disable=SC2015  # A && B || fail: fail when either test is false
# Usage: slurm_elastic.sh SOURCE_DIR BUILD_DIR
# Elastic training under a real Slurm cluster of 2 nodes on this machine
# (tests/e2e/slurm_cluster.sh): scripts/slurm/hsgd_run_elastic.sbatch runs the rendezvous server
# in the batch script and hsgd-run --nnodes 1:2 on each node with one train_mlp worker
# (synthetic data, local SGD with period 4, a step line per step). Once rank 0 printed step 40,
# the worker of the node that does not hold rank 0 is killed with SIGKILL. Checked:
#   - Slurm kept the step (srun --no-kill --kill-on-bad-exit=0): the job ends COMPLETED, 0:0;
#   - rank 0 reported a generation that lost that node and one where it joined again with
#     the state of a live peer, the replica hashes equal;
#   - rank 0's step lines count 1..N once each (no step lost or run twice) and a final accuracy.
# Skipped (77), saying why, without root, network namespaces or the Slurm packages. Everything
# stops by pid, also on failure and at the deadline (HSGD_SLURM_ELASTIC_DEADLINE seconds after the
# start, default 240, below ctest's TIMEOUT of 300).
set -euo pipefail
src=$1
build=$2

# shellcheck source=tests/e2e/slurm_cluster.sh
source "$src/tests/e2e/slurm_cluster.sh"

slurm_job_test slurm_elastic "${HSGD_SLURM_ELASTIC_DEADLINE:-240}"
slurm_cluster_start 2

fail() {
  grep -Ev '\] +step [0-9]+ loss' "$out" 2>/dev/null || true
  echo "slurm_elastic: FAILED: $*" >&2
  exit 1
}
# Rank 0's step lines ("N: [rank 0] [train_mlp] step S loss ...": the lead of each generation
# prints them; hsgd-run's failure report quotes a dead worker's last lines indented, not counted).
steps() { { grep -Eo '^[0-9]+: \[rank [0-9]+\] \[train_mlp\] step [0-9]+ loss' "$1" || true; } |
  grep -Eo '[0-9]+ loss' | grep -Eo '[0-9]+'; }
highest() { steps "$1" | sort -n | tail -1 | { read -r s && echo "$s" || echo 0; }; }

export HSGD_APPS=$build/apps HSGD_NPROC_PER_NODE=1 HSGD_MAX_RESTARTS=2 SLURM_LABELIO=1
id=$(sbatch --parsable -t 5 -o "$out" -N 2 --cpus-per-task=1 \
  "$src/scripts/slurm/hsgd_run_elastic.sbatch" --synthetic --epochs 10 --log-every 1 \
  --mode local-sgd --period 4) || fail "sbatch was refused"
echo "slurm_elastic: job $id submitted"

while [ "$(highest "$out")" -lt 40 ]; do
  check_deadline
  state=$(job_field "$id" JobState)
  case "$state" in PENDING | RUNNING | CONFIGURING | "") ;; *)
    fail "job $id is $state before step 40" ;; esac
  sleep 0.2
done
# The worker of the node that does not hold rank 0 (srun task k runs on the k-th node; a lost
# rank 0 leaves a gap in the step lines, docs/elastic.md): a train_mlp whose environment names
# that node.
lead_task=$(grep -Eo '^[0-9]+: \[rank [0-9]+\] \[train_mlp\] step' "$out" | head -1 | cut -d: -f1)
second=${SC_NODES[$((1 - lead_task))]}
victim=""
for pid in $(pgrep -x train_mlp || true); do
  env_of=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null || true)
  grep -qx "SLURM_JOB_ID=$id" <<<"$env_of" && grep -qx "SLURMD_NODENAME=$second" <<<"$env_of" &&
    victim=$pid && break
done
[ -n "$victim" ] || fail "no train_mlp of job $id on $second"
before=$(highest "$out")
kill -KILL "$victim"
echo "slurm_elastic: killed the worker on $second (pid $victim) at step $before"

while :; do
  check_deadline
  state=$(job_field "$id" JobState)
  case "$state" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;; esac
  sleep 0.3
done
code=$(job_field "$id" ExitCode)
[ "$state" = COMPLETED ] && [ "$code" = 0:0 ] ||
  fail "job $id ended $state, ExitCode=$code; expected COMPLETED, 0:0"
grep -Eq '\[rank [0-9]+\] train_mlp: generation [0-9]+: lost node' "$out" ||
  fail "rank 0 did not report the lost node"
grep -Eq '\[rank [0-9]+\] train_mlp: generation [0-9]+:.*joined node .*received the state from rank 0 .*equal on all 2 ranks' \
  "$out" || fail "rank 0 did not report the node joining again with the state of rank 0"
got=$(steps "$out" | tr '\n' ' ')
last=$(steps "$out" | tail -1)
[ "$got" = "$(seq -s ' ' 1 "$last") " ] || fail "rank 0's steps are not 1..$last once each"
grep -Eq '\[rank 0\] final test accuracy: ' "$out" || fail "no final test accuracy"
echo "slurm_elastic: the worker on $second killed at step $before; the job went on, the node" \
  "rejoined, steps 1..$last once each; COMPLETED in $(($(date +%s) - start_s)) s"
