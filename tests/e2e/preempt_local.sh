#!/usr/bin/env bash
# Usage: preempt_local.sh SOURCE_DIR BUILD_DIR
# Preemption without Slurm, on loopback: SIGUSR1 to hsgd-run makes the workers of train_mlp
# (--checkpoint-dir) agree on a step, write its checkpoint and exit 75, and hsgd-run exit 75;
# the same command again resumes from that checkpoint and the step count continues.
#   1. one hsgd-run, 2 workers: kill -USR1 hsgd-run; the checkpoint's step S is at least the
#      highest step any rank printed before (nothing trained is lost) and the newest complete one;
#      the rerun prints "resumed from DIR/step_S", its first step is S + 1 and its last the planned
#      total; it exits 0.
#   2. two hsgd-runs (2 nodes x 1 worker) on one hsgd-rendezvous: only node 1's hsgd-run gets
#      SIGUSR1; both exit 75 and the ranks saved one step together (one complete checkpoint
#      beyond the epoch ones, written by both ranks); the rerun of both resumes from it and ends
#      at the total.
# Every process is started here and stopped by pid; each run is bounded by `timeout`.
set -euo pipefail
src=$1
build=$2
# shellcheck source=tests/e2e/e2e_lib.sh
source "$src/tests/e2e/e2e_lib.sh"
e2e_init preempt_local

# 6 epochs of 64 steps per rank (synthetic data, 2 ranks): 384 steps; a step line every step.
epochs=6
total=$((epochs * 64))
train=("$mlp" --synthetic --epochs "$epochs" --log-every 1)

# The first step printed in file $1.
first_step() { grep -Eo '\] +step [0-9]+ loss' "$1" | head -1 | grep -Eo '[0-9]+'; }
newest_checkpoint() {
  local d newest=-1 s
  for d in "$1"/step_*; do
    [ -f "$d/manifest" ] || continue
    s=${d##*/step_}
    [ "$s" -gt "$newest" ] && newest=$s
  done
  echo "$newest"
}

# Checks the output $1 of a preempted run whose checkpoints are in $2 and which had printed step
# $3 when it was signalled; prints the step saved.
check_preempted() {
  local out=$1 dir=$2 before=$3 line saved printed
  line=$(grep -E 'preempted \([^)]+\): stopped at step [0-9]+ of '"$total"' after a checkpoint in ' \
    "$out") || fail "no 'preempted ... stopped at step S of $total' line in $out"
  saved=$(sed -E 's/.*stopped at step ([0-9]+) .*/\1/' <<<"$line")
  grep -q "$dir/step_$saved" <<<"$line" || fail "the line names another checkpoint: $line"
  [ "$(newest_checkpoint "$dir")" -eq "$saved" ] ||
    fail "newest complete checkpoint in $dir is step $(newest_checkpoint "$dir"), not $saved"
  printed=$(highest_step "$out")
  [ "$printed" -le "$saved" ] ||
    fail "a rank printed step $printed before stopping, but the checkpoint is step $saved"
  [ "$saved" -ge "$before" ] ||
    fail "step $before was printed before the signal, but the checkpoint is step $saved"
  [ "$saved" -lt "$total" ] || fail "the run was not stopped early (step $saved of $total)"
  echo "$saved"
}

# Checks the output $1 of a run resumed from step $2: it continues at $2 + 1 and ends at total.
check_resumed() {
  local out=$1 saved=$2 dir=$3
  grep -Eq "resumed from $dir/step_$saved \(epoch [0-9]+, step $saved\)" "$out" ||
    fail "no 'resumed from $dir/step_$saved' in $out"
  [ "$(first_step "$out")" -eq $((saved + 1)) ] ||
    fail "the resumed run's first step is $(first_step "$out"), expected $((saved + 1))"
  [ "$(highest_step "$out")" -eq "$total" ] ||
    fail "the resumed run ended at step $(highest_step "$out"), expected $total"
  grep -Eq "final test accuracy: " "$out" || fail "no final report in $out"
}

# ---- 1. one hsgd-run, 2 workers
dir=$work/one
out=$work/one.out
timeout 60 "$run" --nproc-per-node 2 -- "${train[@]}" --checkpoint-dir "$dir" >"$out" 2>&1 &
pid=$!
pids+=("$pid")
wait_for_step "$out" 100
before=$(highest_step "$out")
kill -USR1 "$(hsgd_run_of "$pid")"
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 75 ] || fail "hsgd-run exited $rc after SIGUSR1, expected 75: $(tail -n 20 "$out")"
grep -q "preempted in attempt 0" "$out" || fail "hsgd-run did not say it was preempted"
saved=$(check_preempted "$out" "$dir" "$before")
rc=0
timeout 60 "$run" --nproc-per-node 2 -- "${train[@]}" --checkpoint-dir "$dir" \
  >"$out.resumed" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "the resumed run exited $rc: $(tail -n 20 "$out.resumed")"
check_resumed "$out.resumed" "$saved" "$dir"
echo "preempt_local: one hsgd-run: SIGUSR1 -> checkpoint at step $saved, exit 75; resumed to $total"

# ---- 2. two hsgd-runs, SIGUSR1 to node 1 only
e2e_start_rendezvous
dir=$work/two
two_nodes() {  # two_nodes RUN_ID OUT_PREFIX: starts both nodes, pids in node_pids
  node_pids=()
  local n
  for n in 0 1; do
    timeout 60 "$run" --nnodes 2 --node-rank "$n" --nproc-per-node 1 --rdzv-endpoint "$endpoint" \
      --rdzv-id "$1" -- "${train[@]}" --checkpoint-dir "$dir" >"$2.$n" 2>&1 &
    node_pids+=($!)
    pids+=($!)
  done
}
two_nodes preempt-a "$work/two.out"
wait_for_step "$work/two.out.0" 100
before=$(highest_step "$work/two.out.0")
kill -USR1 "$(hsgd_run_of "${node_pids[1]}")"
for n in 0 1; do
  rc=0
  wait "${node_pids[$n]}" || rc=$?
  [ "$rc" -eq 75 ] || fail "node $n's hsgd-run exited $rc, expected 75: $(tail -n 20 "$work/two.out.$n")"
done
saved=$(check_preempted "$work/two.out.0" "$dir" "$before")
two_nodes preempt-b "$work/two.resumed"
for n in 0 1; do
  rc=0
  wait "${node_pids[$n]}" || rc=$?
  [ "$rc" -eq 0 ] || fail "node $n's resumed hsgd-run exited $rc: $(tail -n 20 "$work/two.resumed.$n")"
done
check_resumed "$work/two.resumed.0" "$saved" "$dir"
echo "preempt_local: two nodes: SIGUSR1 to node 1 -> both saved step $saved, exit 75; resumed to $total"
echo "preempt_local: passed"
