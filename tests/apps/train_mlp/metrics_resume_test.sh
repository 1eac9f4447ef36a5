#!/usr/bin/env bash
# --metrics-out across a resume: a run writes checkpoints at steps 50, 100 and 128 and a record
# every 20 steps; a second run resumes from step_100 with the same --metrics-out. The file must
# then hold each logged step once (the records after step 100 of the first run are dropped and
# trained again), wall_s must continue from the kept records, and it must still be valid JSON
# lines (tests/apps/check_training_run.cmake). ~2 s.
# Usage: metrics_resume_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
mlp=$build/apps/train_mlp/train_mlp
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
metrics=$tmp/metrics.jsonl
train=("$mlp" --synthetic --epochs 1 --hidden 64 --log-every 20 --metrics-out "$metrics"
       --checkpoint-dir "$tmp/ckpt" --checkpoint-every 50 --keep-checkpoints 5)

timeout 60 "${train[@]}" > "$tmp/first.log" 2>&1 || { cat "$tmp/first.log"; echo "first run failed"; exit 1; }
first_records=$(wc -l < "$metrics")
# 128 steps: records at 20..120 and the evaluation at 128.
[ "$first_records" -eq 7 ] || { cat "$metrics"; echo "first run: $first_records records, expected 7"; exit 1; }
wall_at_100=$(sed -n 's/^{"step": 100, .*"wall_s": \([0-9.e+-]*\),.*/\1/p' "$metrics")
[ -n "$wall_at_100" ] || { cat "$metrics"; echo "no record at step 100"; exit 1; }

timeout 60 "${train[@]}" --resume "$tmp/ckpt/step_100" > "$tmp/second.log" 2>&1 ||
  { cat "$tmp/second.log"; echo "resumed run failed"; exit 1; }
grep -q "resumed from $tmp/ckpt/step_100 " "$tmp/second.log" || { cat "$tmp/second.log"; echo "did not resume"; exit 1; }
cat "$metrics"
for step in 20 40 60 80 100 120; do
  n=$(grep -c "^{\"step\": $step, .*\"train_loss\"" "$metrics" || true)
  [ "$n" -eq 1 ] || { echo "step $step has $n training records, expected 1"; exit 1; }
done
wall_at_120=$(sed -n 's/^{"step": 120, .*"wall_s": \([0-9.e+-]*\),.*/\1/p' "$metrics")
awk -v a="$wall_at_100" -v b="$wall_at_120" 'BEGIN { exit !(b > a) }' ||
  { echo "wall_s $wall_at_120 at step 120 does not continue after $wall_at_100 at step 100"; exit 1; }
# The shared validator (valid JSON, steps and wall_s not decreasing, loss and accuracy records).
cmake -DCMD=true -DEXPECT_RC=0 -DEXPECT_REGEX= -DRUN_TIMEOUT=10 -DMETRICS_KEEP=1 \
  -DMETRICS="$metrics" -P "$src/tests/apps/check_training_run.cmake"
echo "metrics_resume_test: ok"
