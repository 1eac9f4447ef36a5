#!/usr/bin/env bash
# --prefetch: train_mlp trains exactly the same run with batches loaded ahead on a background
# thread (--prefetch 3) as with each batch loaded when needed (--prefetch 0): every logged loss
# and the final accuracy are equal as printed. A negative --prefetch is a usage error (exit 2)
# naming the flag. ~2 s.
# Usage: prefetch_test.sh BUILD_DIR
set -euo pipefail
build=$1
mlp=$build/apps/train_mlp/train_mlp
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
train=("$mlp" --synthetic --epochs 2 --hidden 64 --log-every 8)
fail() { echo "prefetch_test: $*"; exit 1; }

for p in 0 3; do
  timeout 60 "${train[@]}" --prefetch "$p" > "$tmp/p$p.log" 2>&1 ||
    { cat "$tmp/p$p.log"; fail "--prefetch $p failed"; }
  # The loss lines and the accuracy; not the timings.
  grep -oE '^  step [0-9]+ loss [0-9.]+|final test accuracy: [0-9.]+%' "$tmp/p$p.log" > "$tmp/p$p.run"
done
steps=$(grep -c 'step' "$tmp/p0.run" || true)
[ "$steps" -ge 10 ] || { cat "$tmp/p0.log"; fail "only $steps loss lines with --prefetch 0"; }
grep -q 'final test accuracy' "$tmp/p0.run" || fail "no final accuracy with --prefetch 0"
diff "$tmp/p0.run" "$tmp/p3.run" || fail "--prefetch 3 trained a different run than --prefetch 0"

set +e
out=$(timeout 30 "$mlp" --synthetic --prefetch -1 2>&1)
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "$out"; fail "--prefetch -1 exited $rc, expected 2"; }
grep -q -- '--prefetch -1 must be at least 0' <<<"$out" || { echo "$out"; fail "message does not name --prefetch"; }
echo "prefetch_test: ok ($steps lines equal)"
