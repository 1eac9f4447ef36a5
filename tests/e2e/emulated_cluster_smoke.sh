#!/usr/bin/env bash
# Usage: emulated_cluster_smoke.sh SOURCE_DIR BUILD_DIR
# Runs a tiny hierarchical job on scripts/emulated_cluster.sh and checks that it trained, that
# both levels averaged, that traffic crossed the link, and that no namespace or process is left.
# Exit 77 (skip) when the script cannot create network namespaces here.
set -euo pipefail
src=$1
build=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT

fail() { cat "$out"; echo "emulated_cluster_smoke: FAILED: $1" >&2; exit 1; }

# --timeout 40 stops (and cleans up) the job well before ctest's TIMEOUT of 90 s.
rc=0
"$src/scripts/emulated_cluster.sh" --rate 1gbit --timeout 40 --build "$build" -- \
  "$build/apps/train_mlp/train_mlp" --synthetic --epochs 1 --mode hierarchical \
  --subgroup-size 1 --hierarchy 2:2,4:4 >"$out" 2>&1 &
pid=$!
wait "$pid" || rc=$?
if [ "$rc" -eq 77 ]; then
  cat "$out"
  echo "emulated_cluster_smoke: skipped, network namespaces are not available"
  exit 77
fi
[ "$rc" -eq 0 ] || fail "exit code $rc, expected 0"
grep -Eq 'final test accuracy: (9[0-9]|100)\.' "$out" || fail "no final test accuracy >= 90%"
grep -Eq 'model averaging level: +2 +2 +[1-9][0-9]* ' "$out" || fail "level 2:2 never averaged"
grep -Eq 'model averaging level: +4 +4 +[1-9][0-9]* ' "$out" || fail "level 4:4 never averaged"
bytes='bytes across the link: node0->node1 [1-9][0-9]{6,}, node1->node0 [1-9][0-9]{6,}$'
grep -Eq "$bytes" "$out" ||
  fail "less than 1 MB crossed the link in some direction"
if ip netns list | grep -q "hsgdemu${pid}n"; then fail "namespaces hsgdemu${pid}n* left behind"; fi
cat "$out"
echo "emulated_cluster_smoke: passed"
