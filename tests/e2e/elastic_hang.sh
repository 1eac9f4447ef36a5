#!/usr/bin/env bash
# Usage: elastic_hang.sh SOURCE_DIR BUILD_DIR
# A hung worker in an elastic job on loopback: two hsgd-runs (--nnodes 1:2, --worker-timeout 4)
# of 2 workers each, train_mlp hierarchical 2:node,8:world on synthetic data. A worker of node 1
# is stopped with SIGSTOP at step >= 20. Node 1's hsgd-run names it as hung after the worker
# timeout, stops its workers and comes back as a joining node; node 0's workers are the same
# processes throughout; rank 0 reports the lost node and the join; both hsgd-runs exit 0; rank
# 0's steps run 1..N once each. Every process is started here and stopped by pid (the stopped
# worker is killed, and continued, at exit); each run is bounded by `timeout`.
set -euo pipefail
src=$1
build=$2
# shellcheck source=tests/e2e/e2e_lib.sh
source "$src/tests/e2e/e2e_lib.sh"
e2e_init elastic_hang
victim=""
e2e_cleanup() {
  if [ -n "$victim" ]; then
    kill -KILL "$victim" 2>/dev/null || true
    kill -CONT "$victim" 2>/dev/null || true
  fi
}

e2e_start_rendezvous

start_node() {  # $1 output
  timeout 150 "$run" --nnodes 1:2 --nproc-per-node 2 --rdzv-endpoint "$endpoint" --rdzv-id hang \
    --rdzv-last-call 1 --heartbeat-timeout 3 --worker-timeout 4 --max-restarts 1 -- "$mlp" \
    --synthetic --epochs 12 --log-every 1 --lr 0.05 --mode hierarchical \
    --hierarchy "2:node,8:world" >"$1" 2>&1 &
  pids+=($!)
  last_pid=$!
}

start_node "$work/hang.0"
t0=$last_pid
wait_registered "$work/hang.0"
start_node "$work/hang.1"
t1=$last_pid
run0=$(hsgd_run_of "$t0")
run1=$(hsgd_run_of "$t1")
wait_for_step "$work/hang.0" 20
before=$(workers_of "$run0")
victim=$(pgrep -P "$run1" | head -1)
[ -n "$victim" ] || fail "no worker under node 1's hsgd-run"
kill -STOP "$victim"
stopped_at=$(highest_step "$work/hang.0")
wait_for_step "$work/hang.0" 300
after=$(workers_of "$run0")
[ "$before" = "$after" ] || fail "node 0's workers changed: '$before' then '$after'"
rc0=0 rc1=0
wait "$t0" || rc0=$?
wait "$t1" || rc1=$?
[ "$rc0" -eq 0 ] || fail "node 0's hsgd-run exited $rc0: $(tail -n 30 "$work/hang.0")"
[ "$rc1" -eq 0 ] || fail "node 1's hsgd-run exited $rc1: $(tail -n 30 "$work/hang.1")"
named=$(grep -E "pid $victim\).* is stopped" "$work/hang.1" | head -1) ||
  fail "node 1's hsgd-run did not name the stopped worker (pid $victim): $(grep -E 'hsgd-run' "$work/hang.1" | tail -n 10)"
grep -q -- "--worker-timeout 4 s" <<<"$named" || fail "the report does not name the timeout: $named"
grep -qE 'generation [0-9]+:.* lost node' "$work/hang.0" ||
  fail "rank 0 did not report the lost node: $(grep generation "$work/hang.0" | head)"
grep -qE 'generation [0-9]+:.* joined node .* equal on all 4 ranks' "$work/hang.0" ||
  fail "rank 0 did not report the join: $(grep generation "$work/hang.0" | head)"
total=$(check_steps "$work/hang.0")
echo "elastic_hang: worker $victim of node 1 stopped at step $stopped_at; named as hung, its node" \
  "left and rejoined; node 0 kept its workers; steps 1..$total once each"
