#!/usr/bin/env bash
# shellcheck disable=SC2015  # A && B || fail: fail when either test is false
# Usage: slurm_preempt.sh SOURCE_DIR BUILD_DIR
# Preemption and requeue under a real Slurm cluster of 2 nodes on this machine
# (tests/e2e/slurm_cluster.sh): scripts/slurm/hsgd_run_preemptible.sbatch (--signal=B:USR1@60,
# --requeue) runs hsgd-run on each node with one train_mlp worker (synthetic data, 10 epochs of
# 64 steps per rank, a step line per step, checkpoints in a directory of this test). Once rank 0
# printed step 40, `scancel --signal=USR1 --batch JOBID` signals the batch script only. Checked:
#   - the script passed the signal on, the ranks stopped at one step S after a checkpoint of S
#     (S at least the step printed before the signal: nothing trained was lost), both hsgd-runs
#     exited 75, and the script said it requeues;
#   - the job was requeued (Restarts=1) and ran again: "resumed from DIR/step_S (..., step S)", its
#     first step S + 1, its last the planned 640, a final test accuracy;
#   - the job ends COMPLETED with ExitCode=0:0.
# Slurm makes a requeued job eligible again 120 s after the requeue (Reason=BeginTime); the test
# sets StartTime=now once the job is pending again and its nodes are idle, 2 s later. 15-35 s.
# Skipped (77), saying why, without root, network namespaces or the Slurm packages. Everything
# stops by pid, also on failure and at the deadline (HSGD_SLURM_PREEMPT_DEADLINE seconds after the
# start, default 240, below ctest's TIMEOUT of 300).
set -euo pipefail
src=$1
build=$2

# shellcheck source=tests/e2e/slurm_cluster.sh
source "$src/tests/e2e/slurm_cluster.sh"

slurm_job_test slurm_preempt "${HSGD_SLURM_PREEMPT_DEADLINE:-240}"
slurm_cluster_start 2

checkpoints=$work/checkpoints
fail() {
  grep -Ev '\] +step [0-9]+ loss' "$out" 2>/dev/null || true
  echo "slurm_preempt: FAILED: $*" >&2
  exit 1
}
total=640
# Rank 0's step lines ("[rank 0]   step N loss ..."), in order, one number per line.
steps() { { grep -Eo '\[rank 0\] +step [0-9]+ loss' "$1" || true; } | grep -Eo '[0-9]+ loss' |
  grep -Eo '[0-9]+'; }
highest() { steps "$1" | sort -n | tail -1 | { read -r s && echo "$s" || echo 0; }; }

export HSGD_APPS=$build/apps HSGD_NPROC_PER_NODE=1 HSGD_CHECKPOINT_DIR=$checkpoints SLURM_LABELIO=1
id=$(sbatch --parsable -t 5 -o "$out" -N 2 --cpus-per-task=1 \
  "$src/scripts/slurm/hsgd_run_preemptible.sbatch" --synthetic --epochs 10 --log-every 1) ||
  fail "sbatch was refused"
echo "slurm_preempt: job $id submitted"

# ---- the first run: wait for step 40, then the signal to the batch script
while [ "$(highest "$out")" -lt 40 ]; do
  check_deadline
  state=$(job_field "$id" JobState)
  case "$state" in PENDING | RUNNING | CONFIGURING | "") ;; *)
    fail "job $id is $state before step 40" ;; esac
  sleep 0.2
done
before=$(highest "$out")
scancel --signal=USR1 --batch "$id" || fail "scancel --signal=USR1 --batch $id failed"
signal_s=$(date +%s)
echo "slurm_preempt: sent SIGUSR1 to the batch script of job $id at step $before" \
  "($((signal_s - start_s)) s after the start)"

# ---- until the job completes (requeued in between)
state=""
pending_s=""
while :; do
  check_deadline
  state=$(job_field "$id" JobState)
  if [ -z "$pending_s" ] && [ "$state" = PENDING ]; then
    pending_s=$(date +%s)
    echo "slurm_preempt: job $id pending again $((pending_s - signal_s)) s after the signal:" \
      "$(scontrol -o show job "$id" | grep -Eo '(Reason|EligibleTime)=[^ ]*' | tr '\n' ' ')"
    # Slurm makes a requeued job eligible only 120 s later; the test does not wait for that, only
    # for the nodes to have finished the first run (a launch on a node still completing it can
    # fail) and then 2 s more: slurmd revokes the first run's credential with a time stamp in
    # whole seconds and refuses any credential of the same job created in that second or before
    # ("Job credential revoked"), which fails the job.
    until [ -z "$(sinfo -h -N -o '%T' | grep -v '^idle$' || true)" ]; do
      check_deadline
      sleep 0.3
    done
    sleep 2
    scontrol update JobId="$id" StartTime=now >"$work/update.out" 2>&1 ||
      fail "scontrol update JobId=$id StartTime=now: $(cat "$work/update.out")"
  fi
  case "$state" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;; esac
  sleep 0.3
done
code=$(job_field "$id" ExitCode)
restarts=$(job_field "$id" Restarts)
[ "$state" = COMPLETED ] && [ "$code" = 0:0 ] ||
  fail "job $id ended $state, ExitCode=$code; expected COMPLETED, 0:0"
[ "$restarts" = 1 ] || fail "job $id has Restarts=$restarts; expected 1 (one requeue)"

# ---- what each run said
grep -Eq "hsgd_run_preemptible: job $id \(start 1\): got SIGUSR1" "$out" ||
  fail "the batch script did not report the SIGUSR1"
line=$(grep -E '\[rank 0\] preempted \([^)]+\): stopped at step [0-9]+ of '"$total"' ' "$out") ||
  fail "rank 0 did not stop at a step after a checkpoint"
saved=$(sed -E 's/.*stopped at step ([0-9]+) .*/\1/' <<<"$line")
grep -q "in $checkpoints/step_$saved;" <<<"$line" || fail "checkpoint not in $checkpoints: $line"
[ "$saved" -ge "$before" ] ||
  fail "step $before was printed before the signal, but the checkpoint is step $saved"
[ "$saved" -lt "$total" ] || fail "the first run was not stopped early (step $saved)"
agents=$(grep -Ec "hsgd-run: job '[^']+' preempted in attempt 0: .* exiting 75" "$out" || true)
[ "$agents" -eq 2 ] || fail "$agents of 2 hsgd-runs said they exit 75"
grep -Eq "hsgd_run_preemptible: job $id \(start 1\): preempted after a checkpoint \(exit 75\): requeueing" \
  "$out" || fail "the batch script did not requeue after exit 75"
grep -Eq "hsgd_run_preemptible: job $id \(start 2\)" "$out" || fail "the job did not run again"
grep -Eq "\[rank 0\] resumed from $checkpoints/step_$saved \(epoch [0-9]+, step $saved\)" "$out" ||
  fail "the requeued run did not resume from $checkpoints/step_$saved"
# Rank 0's steps: 1.. up to S in the first run, then S+1 .. total in the second, nothing else.
resumed_at=$(grep -n "resumed from $checkpoints/step_$saved" "$out" | head -1 | cut -d: -f1)
first_after=$(tail -n +"$resumed_at" "$out" | steps /dev/stdin | head -1)
last_after=$(tail -n +"$resumed_at" "$out" | steps /dev/stdin | tail -1)
last_before=$(head -n "$resumed_at" "$out" | steps /dev/stdin | sort -n | tail -1)
[ "$last_before" -eq "$saved" ] ||
  fail "the first run printed step $last_before, but saved step $saved"
[ "$first_after" -eq $((saved + 1)) ] ||
  fail "the requeued run's first step is $first_after, expected $((saved + 1))"
[ "$last_after" -eq "$total" ] || fail "the requeued run ended at step $last_after, not $total"
grep -Eq '\[rank 0\] final test accuracy: ' "$out" || fail "no final test accuracy"
echo "slurm_preempt: SIGUSR1 at step $before -> checkpoint at step $saved, both hsgd-runs exit 75," \
  "requeued, resumed at step $((saved + 1)), finished at step $total"
echo "slurm_preempt: passed in $(($(date +%s) - start_s)) s (the requeued job ran" \
  "$(($(date +%s) - ${pending_s:-$signal_s})) s after it was pending again)"
