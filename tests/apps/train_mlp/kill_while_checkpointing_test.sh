#!/usr/bin/env bash
# train_mlp writes a checkpoint after every step (about 15 MB each, so a write is often in
# flight); it is SIGKILLed 20 times at random moments (fixed seed). After every kill the newest
# complete checkpoint must be readable (hsgd-checkpoint show checks every checksum), and the next
# start must resume from it. Finally a run finishes and exits 0.
# Usage: kill_while_checkpointing_test.sh BUILD_DIR
set -euo pipefail
build=$1
mlp=$build/apps/train_mlp/train_mlp
tool=$build/apps/hsgd-checkpoint/hsgd-checkpoint
tmp=$(mktemp -d)
child=""
cleanup() {
  [ -n "$child" ] && kill -9 "$child" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
RANDOM=7
train=("$mlp" --synthetic --epochs 2 --hidden 1024,1024 --checkpoint-dir "$tmp/ckpt"
       --checkpoint-every 1)

newest() {  # the newest complete checkpoint's step, or nothing
  [ -d "$tmp/ckpt" ] || return 0
  find "$tmp/ckpt" -maxdepth 2 -name manifest | sed 's#.*/step_\([0-9]*\)/manifest#\1#' |
    sort -n | tail -1
}

previous=-1
for kill in $(seq 1 20); do
  "${train[@]}" > "$tmp/run.log" 2>&1 &
  child=$!
  sleep "$((RANDOM % 2)).$((RANDOM % 9 + 1))"
  kill -9 "$child" 2>/dev/null || true
  wait "$child" 2>/dev/null || true
  child=""
  step=$(newest)
  if [ -n "$step" ]; then
    "$tool" show "$tmp/ckpt/step_$step" > "$tmp/show.log" 2>&1 ||
      { cat "$tmp/show.log"; echo "kill $kill: the newest complete checkpoint step_$step is unreadable"; exit 1; }
    if [ "$previous" -ge 0 ] && ! grep -q "resumed from $tmp/ckpt/step_$previous " "$tmp/run.log"; then
      # A start killed before it printed anything proves nothing; one that trained must have resumed.
      if grep -q "epoch" "$tmp/run.log"; then
        cat "$tmp/run.log"; echo "kill $kill: did not resume from step_$previous"; exit 1
      fi
    fi
    previous=$step
  fi
  echo "kill $kill: newest complete checkpoint step ${step:-none}"
done
[ "$previous" -gt 0 ] || { echo "no checkpoint was ever completed"; exit 1; }
timeout 180 "${train[@]}" > "$tmp/run.log" 2>&1 || { cat "$tmp/run.log"; echo "the final run failed"; exit 1; }
grep -q "resumed from $tmp/ckpt/step_" "$tmp/run.log" || { cat "$tmp/run.log"; echo "the final run did not resume"; exit 1; }
grep "final test accuracy" "$tmp/run.log"
echo "kill_while_checkpointing_test: ok"
