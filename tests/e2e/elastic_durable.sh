#!/usr/bin/env bash
# Usage: elastic_durable.sh SOURCE_DIR BUILD_DIR
# An elastic job with --checkpoint-dir survives the loss of every node (train_mlp, synthetic data,
# hierarchical 1:node,4:world, nodes of 1 worker, --checkpoint-every 10):
#   1. three nodes (--nnodes 2:3); at step >= 45 every hsgd-run, every worker and the rendezvous
#      server are killed with SIGKILL at once. A new server and two of the nodes are started
#      again: rank 0 reports generation 0 "resumed from DIR/step_N" with N >= 40 (the newest
#      complete checkpoint before the kill), its step lines continue at N + 1 (never at 1) up to
#      the total planned by the first run, and both hsgd-runs exit 0.
#   2. two nodes (--nnodes 1:2); at step >= 30 SIGUSR1 goes to each hsgd-run: rank 0 prints "preempted
#      (SIGUSR1): stopped at step S ... after a checkpoint in DIR/step_S", both exit 75, and
#      DIR/step_S is complete. Started again, the job resumes at step S and ends with exit 0.
# Every process is started here and stopped by pid; each run is bounded by `timeout`.
set -euo pipefail
src=$1
build=$2
# shellcheck source=tests/e2e/e2e_lib.sh
source "$src/tests/e2e/e2e_lib.sh"
e2e_init elastic_durable

train=("$mlp" --synthetic --epochs 6 --log-every 1 --lr 0.05 --mode hierarchical
  --hierarchy 1:node,4:world --checkpoint-every 10)

# $1: --nnodes, $2: job id, $3: output file, $4: checkpoint dir; the `timeout` pid in last_pid.
start_node() {
  timeout 120 "$run" --nnodes "$1" --nproc-per-node 1 --rdzv-endpoint "$endpoint" \
    --rdzv-last-call 1 --heartbeat-timeout 3 --rdzv-id "$2" -- "${train[@]}" \
    --checkpoint-dir "$4" >"$3" 2>&1 &
  pids+=($!)
  last_pid=$!
}

# Two nodes, node 0 registered first (it holds rank 0): $1 --nnodes, $2 job id, $3 output files'
# prefix (.0, .1), $4 checkpoint dir; their `timeout` pids in t0 and t1.
start_two() {
  start_node "$1" "$2" "$3.0" "$4"
  t0=$last_pid
  wait_registered "$3.0"
  start_node "$1" "$2" "$3.1" "$4"
  t1=$last_pid
}

# The step lines of FILE are first..last once each, in order; prints "first last".
check_steps_from() {
  local got first last
  got=$(grep -Eo '\] +step [0-9]+ loss' "$1" | grep -Eo '[0-9]+' | tr '\n' ' ')
  first=$(echo "$got" | awk '{print $1}')
  last=$(highest_step "$1")
  [ -n "$first" ] || fail "no step lines in $1: $(tail -n 20 "$1")"
  [ "$got" = "$(seq -s ' ' "$first" "$last") " ] ||
    fail "rank 0's steps in $1 are not $first..$last once each: $(echo "$got" | head -c 300)"
  echo "$first $last"
}

# ---- 1. every node and the server killed at once
ckpt=$work/ckpt_kill
e2e_start_rendezvous
rdzv_pid=${pids[-1]}
start_node 2:3 kill "$work/kill.0" "$ckpt"
t0=$last_pid
wait_registered "$work/kill.0"
for n in 1 2; do start_node 2:3 kill "$work/kill.$n" "$ckpt"; done
wait_for_step "$work/kill.0" 45
planned=$(grep -Eo 'generation 0: .* at step 0 of [0-9]+' "$work/kill.0" | grep -Eo '[0-9]+$' || true)
[ -n "$planned" ] || fail "rank 0 did not report generation 0's plan: $(grep generation "$work/kill.0" | head -3)"
victims="$rdzv_pid"
for t in "${pids[@]}"; do
  r=$(pgrep -P "$t" -x hsgd-run || true)
  [ -n "$r" ] && victims="$victims $r $(pgrep -P "$r" | tr '\n' ' ')"
done
# shellcheck disable=SC2086
kill -KILL $victims
for t in "${pids[@]}"; do wait "$t" 2>/dev/null || true; done
killed_at=$(highest_step "$work/kill.0")
newest=$(find "$ckpt" -maxdepth 2 -name manifest | sed -E 's#.*/step_([0-9]+)/manifest#\1#' |
  sort -n | tail -1)
[ -n "$newest" ] && [ "$newest" -ge 40 ] ||
  fail "no complete checkpoint at step >= 40 in $ckpt (newest '$newest', killed at $killed_at)"
pids=()
e2e_start_rendezvous
start_two 2:3 kill "$work/again" "$ckpt"
expect_exit "$t0" 0 "$work/again.0"
expect_exit "$t1" 0 "$work/again.1"
grep -qE "generation 0: 2 nodes, 2 workers.* at step $newest of $planned; resumed from $ckpt/step_$newest" \
  "$work/again.0" ||
  fail "rank 0 did not resume from step $newest: $(grep -E 'generation|error' "$work/again.0" | head)"
read -r first last <<<"$(check_steps_from "$work/again.0")"
[ "$first" -eq $((newest + 1)) ] || fail "the resumed job's first step is $first, expected $((newest + 1))"
# The length planned by the first generation of 3 nodes, not re-planned on 2.
[ "$last" -eq "$planned" ] || fail "the resumed job ended at step $last, planned $planned"
echo "elastic_durable: all 3 nodes and the server killed at step $killed_at; 2 nodes resumed" \
  "from step_$newest and trained steps $first..$last"

# ---- 2. SIGUSR1 to every hsgd-run
ckpt=$work/ckpt_usr1
# The server of part 1's second job is stopped here: the reset list below no longer holds it.
kill "$rdzv_pid" 2>/dev/null || true
wait "$rdzv_pid" 2>/dev/null || true
pids=()
e2e_start_rendezvous
start_two 1:2 usr1 "$work/usr1" "$ckpt"
wait_for_step "$work/usr1.0" 30
kill -USR1 "$(hsgd_run_of "$t0")" "$(hsgd_run_of "$t1")"
expect_exit "$t0" 75 "$work/usr1.0"
expect_exit "$t1" 75 "$work/usr1.1"
stopped=$(grep -Eo 'preempted \(SIGUSR1\): stopped at step [0-9]+' "$work/usr1.0" | grep -Eo '[0-9]+$' || true)
[ -n "$stopped" ] || fail "rank 0 did not report the preemption: $(tail -n 20 "$work/usr1.0")"
[ -f "$ckpt/step_$stopped/manifest" ] || fail "$ckpt/step_$stopped is not a complete checkpoint"
start_two 1:2 usr1 "$work/usr1again" "$ckpt"
expect_exit "$t0" 0 "$work/usr1again.0"
expect_exit "$t1" 0 "$work/usr1again.1"
grep -qE "at step $stopped of [0-9]+; resumed from $ckpt/step_$stopped" "$work/usr1again.0" ||
  fail "the job did not resume at step $stopped: $(grep generation "$work/usr1again.0" | head)"
read -r first last <<<"$(check_steps_from "$work/usr1again.0")"
[ "$first" -eq $((stopped + 1)) ] || fail "after the preemption the first step is $first"
echo "elastic_durable: SIGUSR1 to both nodes: checkpoint at step $stopped, exit 75 on both;" \
  "resumed at step $first, ended at $last"
