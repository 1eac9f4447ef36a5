#!/usr/bin/env bash
# Usage: elastic_local.sh SOURCE_DIR BUILD_DIR
# Elastic training on loopback: two hsgd-runs (2 nodes x 2 workers) with --nnodes 1:2 on one
# hsgd-rendezvous, train_mlp on synthetic data.
#   1. hierarchical 2:node,8:world: kill -9 of one worker of node 1 at step >= 40. Node 0's workers
#      keep running (the same pids until the end); rank 0 reports a generation that lost node 1
#      and one where node 1's next incarnation joined with the state of a live peer; both
#      hsgd-runs exit 0; rank 0's step lines count 1, 2, ... to the planned total without a gap
#      or a repeat (no survivor's step is lost, none is run twice).
#   2. ddp: the same with kill -9 of node 1's hsgd-run and its workers; the survivors wait for
#      the heartbeat timeout, continue alone, and the same command started again on node 1 joins
#      at a step boundary.
#   3. a late joiner: nodes 0 and 1 start (MIN 2, MAX 3, one worker each); node 2 starts after
#      step 30 and joins right after an averaging over the whole world with the state of rank 0.
# The replicas' hash agreement is checked by train_mlp itself at every generation (it fails the
# job otherwise); this script checks that it was reported. Every process is started here and
# stopped by pid; each run is bounded by `timeout`.
set -euo pipefail
src=$1
build=$2
# shellcheck source=tests/e2e/e2e_lib.sh
source "$src/tests/e2e/e2e_lib.sh"
e2e_init elastic_local

e2e_start_rendezvous

elastic=(--nnodes 1:2 --nproc-per-node 2 --rdzv-endpoint "$endpoint" --rdzv-last-call 1
  --heartbeat-timeout 3 --max-restarts 1)
epochs=12
train=("$mlp" --synthetic --epochs "$epochs" --log-every 1 --lr 0.05)

# $1: job id, $2: output file, rest: train_mlp flags; the `timeout` pid in last_pid.
start_node() {
  local id=$1 out=$2
  shift 2
  timeout 120 "$run" "${elastic[@]}" --rdzv-id "$id" -- "${train[@]}" "$@" >"$out" 2>&1 &
  pids+=($!)
  last_pid=$!
}

# ---- 1. hierarchical: kill -9 of one worker of node 1
h=(--mode hierarchical --hierarchy "2:node,8:world")
start_node hier "$work/hier.0" "${h[@]}"
t0=$last_pid
wait_registered "$work/hier.0"
start_node hier "$work/hier.1" "${h[@]}"
t1=$last_pid
run0=$(hsgd_run_of "$t0")
run1=$(hsgd_run_of "$t1")
wait_for_step "$work/hier.0" 40
before=$(workers_of "$run0")
victim=$(pgrep -P "$run1" | head -1)
[ -n "$victim" ] || fail "no worker under node 1's hsgd-run"
kill -KILL "$victim"
# Node 0's workers are the same processes near the end of the run.
wait_for_step "$work/hier.0" 300
after=$(workers_of "$run0")
[ "$before" = "$after" ] || fail "node 0's workers changed: '$before' then '$after'"
rc0=0 rc1=0
wait "$t0" || rc0=$?
wait "$t1" || rc1=$?
[ "$rc0" -eq 0 ] || fail "node 0's hsgd-run exited $rc0: $(tail -n 30 "$work/hier.0")"
[ "$rc1" -eq 0 ] || fail "node 1's hsgd-run exited $rc1: $(tail -n 30 "$work/hier.1")"
grep -qE 'generation [0-9]+:.* lost node' "$work/hier.0" ||
  fail "rank 0 did not report the lost node: $(grep generation "$work/hier.0" | head)"
grep -qE 'generation [0-9]+:.* joined node .* received the state from rank [0-9]+ \([0-9]+ bytes\).* equal on all 4 ranks' \
  "$work/hier.0" || fail "rank 0 did not report the join: $(grep generation "$work/hier.0" | head)"
total=$(check_steps "$work/hier.0")
acc=$(grep -Eo 'final test accuracy: [0-9.]+' "$work/hier.0" | grep -Eo '[0-9.]+$')
[ -n "$acc" ] || fail "no final accuracy in $work/hier.0"
awk -v a="$acc" 'BEGIN { exit !(a >= 80) }' || fail "final accuracy $acc% below 80%"
echo "elastic_local: hierarchical: worker of node 1 killed at step >= 40; node 0 kept its" \
  "workers; node 1 rejoined; steps 1..$total once each; accuracy $acc%"

# ---- 2. ddp: kill -9 of node 1's hsgd-run and workers, then the same command again
start_node ddp "$work/ddp.0" --mode ddp
t0=$last_pid
wait_registered "$work/ddp.0"
start_node ddp "$work/ddp.1" --mode ddp
t1=$last_pid
run0=$(hsgd_run_of "$t0")
run1=$(hsgd_run_of "$t1")
wait_for_step "$work/ddp.0" 40
before=$(workers_of "$run0")
victims="$run1 $(pgrep -P "$run1" | tr '\n' ' ')"
# shellcheck disable=SC2086
kill -KILL $victims
wait "$t1" 2>/dev/null || true
# The survivors continue alone once the heartbeat timeout (3 s) dropped node 1.
for _ in $(seq 200); do
  grep -qE 'generation [0-9]+:.* lost node' "$work/ddp.0" && break
  sleep 0.1
done
grep -qE 'generation [0-9]+:.* lost node' "$work/ddp.0" ||
  fail "node 0 did not continue without node 1: $(tail -n 20 "$work/ddp.0")"
start_node ddp "$work/ddp.1b" --mode ddp
t1=$last_pid
rc0=0 rc1=0
wait "$t0" || rc0=$?
wait "$t1" || rc1=$?
[ "$rc0" -eq 0 ] || fail "node 0's hsgd-run exited $rc0: $(tail -n 30 "$work/ddp.0")"
[ "$rc1" -eq 0 ] || fail "node 1's restarted hsgd-run exited $rc1: $(tail -n 30 "$work/ddp.1b")"
after=$(workers_of "$run0" || true)
grep -qE 'generation [0-9]+:.* joined node' "$work/ddp.0" ||
  fail "the restarted node 1 did not join: $(grep generation "$work/ddp.0" | head)"
total=$(check_steps "$work/ddp.0")
echo "elastic_local: ddp: node 1 killed (hsgd-run and workers); node 0 continued; the same" \
  "command rejoined; steps 1..$total once each"

# ---- 3. a late joiner: nodes of 1 worker, so that the world (8:world) is the only level that
# spans the nodes: it averages in steps 1, 9, 17, ... (the averager counts its calls from 0).
late=(--nnodes 2:3 --nproc-per-node 1 --rdzv-endpoint "$endpoint" --rdzv-last-call 1
  --heartbeat-timeout 3 --rdzv-id late)
late_pids=()
for n in 0 1 2; do
  if [ "$n" -eq 2 ]; then wait_for_step "$work/late.0" 30; fi
  timeout 120 "$run" "${late[@]}" -- "${train[@]}" "${h[@]}" --eval-every 20 >"$work/late.$n" 2>&1 &
  pids+=($!)
  late_pids+=($!)
  if [ "$n" -eq 0 ]; then wait_registered "$work/late.0"; fi
done
for n in 0 1 2; do
  rc=0
  wait "${late_pids[$n]}" || rc=$?
  [ "$rc" -eq 0 ] || fail "node $n's hsgd-run exited $rc: $(tail -n 30 "$work/late.$n")"
done
line=$(grep -E 'generation 1: joined node' "$work/late.0") ||
  fail "no join in generation 1: $(grep generation "$work/late.0" | head)"
join_step=$(sed -E 's/.* at step ([0-9]+).*/\1/' <<<"$line")
[ $(((join_step - 1) % 8)) -eq 0 ] || fail "node 2 joined at step $join_step, not at a world averaging"
grep -q 'received the state from rank 0' <<<"$line" || fail "the join did not send state: $line"
grep -q 'equal on all 3 ranks' <<<"$line" || fail "the join did not compare 3 hashes: $line"
# --eval-every in an elastic run: rank 0 evaluates the average of the replicas every 20 steps,
# in the generation before the join and in the one after.
evals=$(grep -oE '^\[rank 0\] eval: epoch [0-9]+ step [0-9]+ train_s [0-9.]+ test_accuracy [0-9.]+%' "$work/late.0" |
  awk '{print $7}' | tr '\n' ' ')
awk -v j="$join_step" '{ for (i = 1; i <= NF; i++) { if ($i < j) b = 1; if ($i > j) a = 1 } }
  END { exit !(a && b) }' <<<"$evals" ||
  fail "no --eval-every line before and after the join at step $join_step: '$evals'"
echo "elastic_local: late joiner: joined at step $join_step (a world averaging step); evaluations" \
  "every 20 steps on both sides of it ($(wc -w <<<"$evals") lines)"

# ---- 4. a late joiner with another model is refused by name and leaves; the job goes on
other=(--nnodes 1:2 --nproc-per-node 1 --rdzv-endpoint "$endpoint" --rdzv-last-call 1
  --heartbeat-timeout 3 --max-restarts 2 --rdzv-id other)
timeout 120 "$run" "${other[@]}" -- "${train[@]}" "${h[@]}" >"$work/other.0" 2>&1 &
pids+=($!)
t0=$!
wait_for_step "$work/other.0" 30
rc1=0
timeout 120 "$run" "${other[@]}" -- "${train[@]}" "${h[@]}" --hidden 64 >"$work/other.1" 2>&1 ||
  rc1=$?
[ "$rc1" -eq 78 ] || fail "the node with --hidden 64 exited $rc1, expected 78: $(tail -n 20 "$work/other.1")"
grep -q 'cannot join elastic generation' "$work/other.1" ||
  fail "no refusal in $work/other.1: $(tail -n 20 "$work/other.1")"
grep -qE "differs from the job's .*model 6 tensors, [0-9]+ values" <(tr '\n' ' ' <"$work/other.1") ||
  fail "the refusal does not name the model: $(grep -A3 'cannot join' "$work/other.1")"
rc0=0
wait "$t0" || rc0=$?
[ "$rc0" -eq 0 ] || fail "node 0's hsgd-run exited $rc0 after the refused joiner: $(tail -n 30 "$work/other.0")"
echo "elastic_local: a joiner with another model: refused by name, exit 78, no restart; node 0 finished"
