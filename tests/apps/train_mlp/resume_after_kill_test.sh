#!/usr/bin/env bash
# SIGKILL one worker of a 4-worker hierarchical job at a step chosen by SEED; hsgd-run restarts
# the job, which resumes from its newest complete checkpoint and finishes. Checks:
#   - hsgd-run exits 0 after exactly one restart, and the restarted attempt says "resumed from";
#   - the work lost (kill step - resumed step) is at most two checkpoint intervals (the kill may
#     interrupt the write of the newest checkpoint, which then does not count), and hsgd-run's
#     final line counts the same loss ("N steps lost to restarts", within the skew explained
#     below);
#   - every rank's final parameters equal those of an uninterrupted run of the same command to a
#     max relative error of 1e-6 (hsgd-checkpoint diff of the final checkpoints).
# Usage: resume_after_kill_test.sh BUILD_DIR SEED      (SEED 1..5)
set -euo pipefail
build=$1
seed=$2
run=$build/apps/hsgd-run/hsgd-run
mlp=$build/apps/train_mlp/train_mlp
tool=$build/apps/hsgd-checkpoint/hsgd-checkpoint
tmp=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

every=8
epochs=3  # 8192 synthetic examples / 4 ranks / batch 64: 32 steps an epoch, 96 in all
total=$((epochs * 32))
train=("$mlp" --synthetic --mode hierarchical --hierarchy 2:2,4:4 --subgroup-size 1
       --epochs "$epochs" --hidden 256,128 --log-every 1 --checkpoint-every "$every")

# The kill step by seed: mid-interval (1-3), on a checkpoint step (4: the kill races the
# background write), at an epoch end that is also a checkpoint step (5).
kill_steps=(0 41 70 29 48 64)
kill_step=${kill_steps[$seed]}
echo "seed $seed: killing one worker when rank 0 reports step $kill_step"

timeout 120 "$run" --nproc-per-node 4 -- "${train[@]}" --checkpoint-dir "$tmp/reference" \
  > "$tmp/reference.log" 2>&1 || { cat "$tmp/reference.log"; echo "reference run failed"; exit 1; }

"$run" --nproc-per-node 4 --max-restarts 1 -- "${train[@]}" --checkpoint-dir "$tmp/killed" \
  > "$tmp/killed.log" 2>&1 &
launcher=$!
pids+=("$launcher")
deadline=$((SECONDS + 90))
until grep -q "^\[rank 0\]   step $kill_step loss" "$tmp/killed.log" 2>/dev/null; do
  if ! kill -0 "$launcher" 2>/dev/null || [ $SECONDS -gt $deadline ]; then
    cat "$tmp/killed.log"; echo "rank 0 never reported step $kill_step"; exit 1
  fi
  sleep 0.01
done
mapfile -t workers < <(ps -o pid= --ppid "$launcher" | tr -d ' ')
[ ${#workers[@]} -eq 4 ] || { echo "expected 4 workers, found ${#workers[@]}"; exit 1; }
victim=${workers[$((seed % 4))]}
kill -9 "$victim"
echo "killed worker pid $victim"
set +e
timeout 120 tail --pid="$launcher" -f /dev/null
wait "$launcher"
rc=$?
set -e
cat "$tmp/killed.log" | grep -v '  step ' || true
[ "$rc" -eq 0 ] || { echo "hsgd-run exited $rc after the kill, expected 0"; exit 1; }
resumed=$(sed -n 's/.*resumed from .*step_\([0-9]*\) (epoch.*/\1/p' "$tmp/killed.log" | head -1)
[ -n "$resumed" ] || { echo "the restarted attempt did not resume from a checkpoint"; exit 1; }
# The kill lands a few steps after rank 0's line at kill_step (the time to see the line and run
# ps): the work lost is counted from rank 0's last step before the restart.
last=$(awk '/restarting all nodes/ { exit } /^\[rank 0\]   step [0-9]+ loss/ { n = $4 } END { print n }' \
  "$tmp/killed.log")
[ -n "$last" ] && [ "$last" -ge "$kill_step" ] || { echo "no step of rank 0 before the restart"; exit 1; }
lost=$((last - resumed))
echo "killed at step $kill_step (rank 0's last step: $last), resumed from step $resumed: $lost steps lost"
[ "$lost" -ge 0 ] || { echo "resumed from step $resumed, after the last step $last"; exit 1; }
[ "$lost" -le $((2 * every)) ] || { echo "lost $lost steps, more than 2 x $every"; exit 1; }
# hsgd-run's own count of steps lost to restarts: the highest step any worker reported before the failure minus
# the step the restarted attempt resumed from. Ranks may lead rank 0 (local SGD lets a rank run
# ahead until the next averaging that needs the killed one: at most the top period, 4 here) and
# rank 0 reports a step just before printing it: so ours <= hsgd-run's <= ours + 4 + 1.
run_lost=$(sed -n "s/.*exited 0 after 1 restart(s); \([0-9]*\) steps\{0,1\} lost to restarts.*/\1/p" \
  "$tmp/killed.log")
[ -n "$run_lost" ] || { echo "hsgd-run's final line has no 'N steps lost to restarts'"; exit 1; }
echo "hsgd-run counted $run_lost steps lost to restarts"
[ "$run_lost" -ge "$lost" ] && [ "$run_lost" -le $((lost + 5)) ] ||
  { echo "hsgd-run counted $run_lost steps lost, this script $lost: not within 0..5 more"; exit 1; }
for rank in 0 1 2 3; do
  "$tool" diff "$tmp/killed/step_$total" "$tmp/reference/step_$total" --rank "$rank" \
    --only model. --tolerance 1e-6 | tail -1
done
echo "resume_after_kill_test: ok"
