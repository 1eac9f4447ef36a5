#!/usr/bin/env bash
# A resumed ResNet run on augmented Fashion-MNIST is exact: the crop + flip of an example depends
# on (seed, epoch, index) only, so a run resumed mid-epoch from a checkpoint ends with the same
# parameters and BatchNorm statistics as the uninterrupted run (hsgd-checkpoint diff, tolerance
# 0). 128 training images, batch 16: 8 steps an epoch, 2 epochs; resumed from step 12 (mid-epoch
# 2). A control run with another --seed must differ, so the diff can fail. ~15 s.
# Usage: resume_exact_test.sh BUILD_DIR
set -euo pipefail
build=$1
resnet=$build/apps/train_resnet/train_resnet
tool=$build/apps/hsgd-checkpoint/hsgd-checkpoint
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
train=("$resnet" --dataset fashion-mnist --train-subset 128 --batch-size 16 --epochs 2
       --max-eval 100 --log-every 4 --checkpoint-every 4 --keep-checkpoints 10)

timeout 120 "${train[@]}" --checkpoint-dir "$tmp/reference" > "$tmp/reference.log" 2>&1 ||
  { cat "$tmp/reference.log"; echo "reference run failed"; exit 1; }
timeout 120 "${train[@]}" --checkpoint-dir "$tmp/resumed" --resume "$tmp/reference/step_12" \
  > "$tmp/resumed.log" 2>&1 || { cat "$tmp/resumed.log"; echo "resumed run failed"; exit 1; }
grep -q "resumed from $tmp/reference/step_12 (epoch 2, step 12)" "$tmp/resumed.log" ||
  { cat "$tmp/resumed.log"; echo "did not resume from step_12"; exit 1; }
grep "  step 16 loss" "$tmp/reference.log" "$tmp/resumed.log"
"$tool" diff "$tmp/resumed/step_16" "$tmp/reference/step_16" --only model. --tolerance 0 |
  tail -1 || { echo "the resumed run's model differs from the uninterrupted run's"; exit 1; }

timeout 120 "${train[@]}" --seed 1 --checkpoint-dir "$tmp/control" > "$tmp/control.log" 2>&1 ||
  { cat "$tmp/control.log"; echo "control run failed"; exit 1; }
if "$tool" diff "$tmp/control/step_16" "$tmp/reference/step_16" --only model. --tolerance 0 \
    > "$tmp/control_diff.log" 2>&1; then
  echo "a run with another seed has the same model: the diff cannot tell runs apart"; exit 1
fi
echo "resume_exact_test: ok"
