#!/usr/bin/env bash
# Usage: elastic_join_source_kill.sh SOURCE_DIR BUILD_DIR
# A join whose source dies mid-transfer, on loopback: nodes A and B (2 workers each, hsgd-run
# --nnodes 2:3, default collective timeout) train train_mlp hierarchically (2:node,8:world); node C
# (2 workers) joins. The state goes from rank 0 (A's local rank 0), which kills itself with
# SIGKILL as the broadcast of the state starts (HSGD_FAULT_KILL_IN_COLLECTIVE, the second
# 'the elastic state' transfer: the first is generation 0's fresh start), so that every other
# rank is inside the transfer when its source goes.
# Checked:
#   - the fault line names the state transfer;
#   - no rank waited for a collective timeout: every rank's transfer failed from the loss, not
#     from a timeout (no "timed out", no "has waited");
#   - the next generation holds B and C, and C received the state from another survivor (B's
#     rank 0), with equal replica hashes on all ranks, at the step where A's rank 0 stopped (the
#     run never restarts from step 0);
#   - A, started again by its hsgd-run, rejoins; all three hsgd-runs exit 0;
#   - rank 0's step lines (A's before the kill, then B's) run 1..N once each.
# Printed, not asserted (a shared machine): the survivors' pause from the first report of the loss
# to the next generation's formation. Every process is started here and stopped by pid; each run
# is bounded by `timeout`.
set -euo pipefail
src=$1
build=$2
# shellcheck source=tests/e2e/e2e_lib.sh
source "$src/tests/e2e/e2e_lib.sh"
e2e_init elastic_join_source_kill

e2e_start_rendezvous

# $1 output, $2 fault spec ('' for none).
start_node() {
  HSGD_FAULT_KILL_IN_COLLECTIVE=$2 timeout 150 "$run" --nnodes 2:3 --nproc-per-node 2 \
    --rdzv-endpoint "$endpoint" --rdzv-id joinkill --rdzv-last-call 1 --max-restarts 1 -- \
    "$mlp" --synthetic --epochs 12 --log-every 1 --lr 0.05 --mode hierarchical \
    --hierarchy 2:node,8:world >"$1" 2>&1 &
  pids+=($!)
  last_pid=$!
}

start_node "$work/a" "'the elastic state'#2@0"
a=$last_pid
wait_registered "$work/a"
start_node "$work/b" ""
b=$last_pid
wait_for_step "$work/a" 20
start_node "$work/c" ""
c=$last_pid
expect_exit "$a" 0 "$work/a"
expect_exit "$b" 0 "$work/b"
expect_exit "$c" 0 "$work/c"

fault=$(grep -hE '^\[rank 0\] hsgd fault injection: SIGKILL' "$work/a") ||
  fail "node A's rank 0 did not kill itself: $(grep -E 'generation' "$work/a" | tail -n 5)"
grep -q "'the elastic state'" <<<"$fault" || fail "the kill was not in the state transfer: $fault"
if grep -hE "of group '[^']*' .*timed out|has waited [0-9]+ ms" "$work/a" "$work/b" "$work/c" >"$work/timeouts"; then
  fail "a rank waited for a collective timeout: $(head -n 3 "$work/timeouts")"
fi
line=$(grep -hE 'train_mlp: generation [0-9]+: lost node' "$work/b") ||
  fail "B did not report a generation without A: $(grep -h 'train_mlp: generation' "$work/b")"
grep -qE 'joined node .* 2 nodes, 4 workers, .* received the state from rank 0 .* equal on all 4 ranks' <<<"$line" ||
  fail "C did not receive the state from B's rank 0 with equal hashes: $line"
stopped=$(highest_step "$work/a")
at=$(sed -E 's/.* at step ([0-9]+) of .*/\1/' <<<"$line")
[ "$at" -ge "$stopped" ] || fail "the job went back from step $stopped to step $at: $line"
grep -qE 'train_mlp: generation [0-9]+: joined node .* 3 nodes, 6 workers, .* equal on all 6 ranks' "$work/b" ||
  fail "A did not rejoin: $(grep -h 'train_mlp: generation' "$work/b")"
# The step lines rank 0 printed (hsgd-run's failure report quotes the last ones again, indented).
grep -hE '^\[rank 0\] \[train_mlp\] step' "$work/a" "$work/b" >"$work/rank0"
last=$(check_steps "$work/rank0")
first_loss=$(grep -hE 'lost a member' "$work/b" "$work/c" | head -n 1 | grep -Eo '^\[rank [0-9]+\] \[[0-9:.]+\]' | grep -Eo '[0-9:.]+\]$' | tr -d ']')
formed=$(grep -hE 'elastic generation [0-9]+: rank 0 of 4' "$work/b" | head -n 1 | grep -Eo '\] \[[0-9:.]+\]' | head -n 1 | tr -d '[] ')
pause=$(awk -v a="$first_loss" -v b="$formed" 'function s(t, p) { split(t, p, ":"); return p[1] * 3600 + p[2] * 60 + p[3] }
  BEGIN { printf "%.2f", s(b) - s(a) }')
echo "elastic_join_source_kill: $(sed -E 's/.*SIGKILL in //; s/ \(HSGD.*//' <<<"$fault") killed at" \
  "step $stopped; no collective timeout; C received the state from B at step $at, $pause s after" \
  "the first report of the loss; A rejoined; steps 1..$last once each"
