#!/usr/bin/env bash
# Usage: elastic_streaming.sh SOURCE_DIR BUILD_DIR
# A node joins a running elastic job whose world level streams in fragments
# (8:world@outer=0.5/0.5/nesterov,fragments=4,bf16,ef) on loopback: nodes A and B of one worker
# each train train_mlp on synthetic data (--nnodes 1:3), so that their replicas differ between
# averagings (a fragmented level never averages the whole model at one step); then node C joins.
# Checked: the vote is at a step where the world level starts its period (1, 9, 17, ...), where
# the runtime averages the replicas first, so the join's replica hashes are equal on all 3
# ranks; the top level's anchors and outer momentum, per fragment, come from rank 0; all three
# hsgd-runs exit 0; rank 0's steps run 1..N once each.
# Every process is started here and stopped by pid; each run is bounded by `timeout`.
set -euo pipefail
src=$1
build=$2
# shellcheck source=tests/e2e/e2e_lib.sh
source "$src/tests/e2e/e2e_lib.sh"
e2e_init elastic_streaming

e2e_start_rendezvous

# $1 job id, $2 output, $3 hierarchy; one worker per node.
start_node() {
  local id=$1 out=$2 hierarchy=$3
  timeout 150 "$run" --nnodes 1:3 --nproc-per-node 1 \
    --rdzv-endpoint "$endpoint" --rdzv-id "$id" --rdzv-last-call 1 --heartbeat-timeout 3 \
    --max-restarts 1 -- "$mlp" --synthetic --epochs 12 --log-every 1 --lr 0.05 \
    --mode hierarchical --hierarchy "$hierarchy" >"$out" 2>&1 &
  pids+=($!)
  last_pid=$!
}

streaming="8:world@outer=0.5/0.5/nesterov,fragments=4,bf16,ef"
start_node join "$work/join.a" "$streaming"
ja=$last_pid
wait_registered "$work/join.a"
start_node join "$work/join.b" "$streaming"
jb=$last_pid
for _ in $(seq 600); do
  grep -qE 'train_mlp: generation [0-9]+:.* 2 nodes, 2 workers' "$work/join.a" && break
  sleep 0.1
done
two=$(grep -E 'train_mlp: generation [0-9]+:.* 2 nodes, 2 workers' "$work/join.a") ||
  fail "join: nodes A and B did not form a generation within 60 s: $(grep -E 'generation' "$work/join.a")"
wait_for_step "$work/join.a" $(($(sed -E 's/.* at step ([0-9]+).*/\1/' <<<"$two") + 30))
start_node join "$work/join.c" "$streaming"
expect_exit "$ja" 0 "$work/join.a"
expect_exit "$jb" 0 "$work/join.b"
expect_exit "$last_pid" 0 "$work/join.c"
line=$(grep -E 'train_mlp: generation [0-9]+: joined node .* 3 nodes, 3 workers' "$work/join.a") ||
  fail "join: node C did not join: $(grep -E 'train_mlp: generation' "$work/join.a")"
grep -qE 'received the state from rank 0 .* equal on all 3 ranks' <<<"$line" ||
  fail "join: not a join from rank 0's state with equal hashes: $line"
grep -qE "top level 8:3@outer=0.5/0.5/nesterov,fragments=4,bf16,ef: anchor and outer momentum from rank 0" <<<"$line" ||
  fail "join: the streaming top level's anchors and momentum were not carried: $line"
join_step=$(sed -E 's/.* at step ([0-9]+).*/\1/' <<<"$line")
[ $(((join_step - 1) % 8)) -eq 0 ] ||
  fail "join: at step $join_step, not where the world level starts its period: $line"
total=$(check_steps "$work/join.a")
echo "elastic_streaming: node C joined A and B's streaming run at step $join_step with equal" \
  "hashes on 3 ranks, the top level's per-fragment state carried; steps 1..$total once each"
