#!/usr/bin/env bash
# Usage: elastic_membership.sh SOURCE_DIR BUILD_DIR
# Membership paths of elastic training on loopback (hsgd-runs of one train_mlp worker each on one
# hsgd-rendezvous; synthetic data, a step line per step):
#   1. two failures at once: 3 nodes (--nnodes 1:3, hierarchical 2:node,8:world); the workers of
#      nodes 1 and 2 are killed together; node 0 goes on alone, both come back, the job ends with
#      3 nodes and rank 0's steps 1..N once each;
#   2. below MIN: --nnodes 2:3 with 2 nodes; node 1's hsgd-run and worker are killed (no
#      restart); node 0 stops training and waits (no step while alone), then the same command
#      started again on node 1 lets the job resume; steps 1..N once each;
#   3. MAX: --nnodes 1:2 and a third node: it is not admitted (never in a generation) while two
#      nodes train, and the job's two nodes finish;
#   4. a join during warm-up (--warmup-steps 1000, every step synchronises the whole world): the
#      late node joins at the next step, not at an averaging boundary;
#   5. the rendezvous server is killed with SIGKILL at step 40 and started again 10 s later on the
#      same address, while the job still runs: training goes on meanwhile, the membership does not
#      change (one generation), both hsgd-runs exit 0 and rank 0's steps run 1..N once each.
# Every process is started here and stopped by pid; each run is bounded by `timeout`.
set -euo pipefail
src=$1
build=$2
# shellcheck source=tests/e2e/e2e_lib.sh
source "$src/tests/e2e/e2e_lib.sh"
e2e_init elastic_membership

e2e_start_rendezvous

# $1 job id, $2 output, $3.. hsgd-run flags before "--", then train_mlp flags after "::".
# --lr 0.02: with the default 0.05 (momentum 0.9) a lone worker's loss on the synthetic set can
# grow without bound after a few hundred steps, and train_mlp then stops at a non-finite loss.
start() {
  local id=$1 out=$2
  shift 2
  local agent=() train=()
  while [ $# -gt 0 ] && [ "$1" != "::" ]; do agent+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  train=("$@")
  timeout 150 "$run" --nproc-per-node 1 --rdzv-endpoint "$endpoint" --rdzv-id "$id" \
    --rdzv-last-call 1 --heartbeat-timeout 3 "${agent[@]}" -- "$mlp" --synthetic --log-every 1 \
    --lr 0.02 "${train[@]}" >"$out" 2>&1 &
  pids+=($!)
  last_pid=$!
}
h=(--mode hierarchical --hierarchy "2:node,8:world")

# ---- 1. two failures at once
two=()
for n in 0 1 2; do
  start two "$work/two.$n" --nnodes 1:3 --max-restarts 1 :: --epochs 30 "${h[@]}"
  two+=("$last_pid")
  wait_registered "$work/two.$n"
done
wait_for_step "$work/two.0" 40
v1=$(pgrep -P "$(hsgd_run_of "${two[1]}")")
v2=$(pgrep -P "$(hsgd_run_of "${two[2]}")")
# shellcheck disable=SC2086
kill -KILL $v1 $v2
expect_exit "${two[0]}" 0 "$work/two.0"
expect_exit "${two[1]}" 0 "$work/two.1"
expect_exit "${two[2]}" 0 "$work/two.2"
grep -qE 'generation [0-9]+:.*lost node .*; lost node .*1 nodes, 1 workers' "$work/two.0" ||
  grep -qE 'generation [0-9]+:.*lost node' "$work/two.0" ||
  fail "rank 0 did not report the lost nodes: $(grep -E 'train_mlp: generation' "$work/two.0")"
tail -n 40 "$work/two.0" | grep -qE 'train_mlp: elastic, [0-9]+ generations, 3 ranks at the end' ||
  fail "the job did not end with 3 ranks: $(grep -E 'train_mlp: (generation|elastic)' "$work/two.0")"
last=$(check_steps "$work/two.0")
echo "elastic_membership: two nodes killed at once; node 0 went on, both rejoined; steps 1..$last"

# ---- 2. below MIN: wait, then resume
start min "$work/min.0" --nnodes 2:3 :: --epochs 30 "${h[@]}"
min0=$last_pid
wait_registered "$work/min.0"
start min "$work/min.1" --nnodes 2:3 :: --epochs 30 "${h[@]}"
min1=$last_pid
wait_for_step "$work/min.0" 40
agent1=$(hsgd_run_of "$min1")
# shellcheck disable=SC2046
kill -KILL "$agent1" $(pgrep -P "$agent1")
wait "$min1" 2>/dev/null || true
sleep 8  # the heartbeat timeout (3 s) drops node 1; node 0 is then alone, below MIN
stalled=$(highest_step "$work/min.0")
sleep 3
[ "$(highest_step "$work/min.0")" -eq "$stalled" ] ||
  fail "node 0 trained alone below MIN 2 (step $stalled, then $(highest_step "$work/min.0"))"
start min "$work/min.1b" --nnodes 2:3 :: --epochs 30 "${h[@]}"
min1=$last_pid
expect_exit "$min0" 0 "$work/min.0"
expect_exit "$min1" 0 "$work/min.1b"
last=$(check_steps "$work/min.0")
echo "elastic_membership: below MIN, node 0 waited at step $stalled; the restarted node 1 let" \
  "the job resume; steps 1..$last"

# ---- 3. MAX: a third node is not admitted
start max "$work/max.0" --nnodes 1:2 :: --epochs 20 "${h[@]}"
max0=$last_pid
wait_registered "$work/max.0"
start max "$work/max.1" --nnodes 1:2 :: --epochs 20 "${h[@]}"
max1=$last_pid
wait_for_step "$work/max.0" 20
start max "$work/max.2" --nnodes 1:2 :: --epochs 20 "${h[@]}"
max2=$last_pid
expect_exit "$max0" 0 "$work/max.0"
expect_exit "$max1" 0 "$work/max.1"
rc2=0
wait "$max2" || rc2=$?
if grep -qE 'train_mlp: generation [0-9]+: .*3 workers' "$work/max.0"; then
  fail "a third node was admitted with --nnodes 1:2"
fi
echo "elastic_membership: MAX 2: the third node was never admitted (its hsgd-run exited $rc2:" \
  "$(grep -E 'hsgd-run: ' "$work/max.2" | tail -1 | cut -c1-160))"

# ---- 4. a join during warm-up
start warm "$work/warm.0" --nnodes 1:2 :: --epochs 20 "${h[@]}" --warmup-steps 1000
warm0=$last_pid
wait_for_step "$work/warm.0" 30
start warm "$work/warm.1" --nnodes 1:2 :: --epochs 20 "${h[@]}" --warmup-steps 1000
warm1=$last_pid
expect_exit "$warm0" 0 "$work/warm.0"
expect_exit "$warm1" 0 "$work/warm.1"
line=$(grep -E 'train_mlp: generation 1: joined node' "$work/warm.0") ||
  fail "no join in generation 1: $(grep -E 'train_mlp: generation' "$work/warm.0")"
grep -q 'received the state from rank 0' <<<"$line" || fail "the join sent no state: $line"
join_step=$(sed -E 's/.* at step ([0-9]+).*/\1/' <<<"$line")
[ "$join_step" -lt 1000 ] || fail "the join at step $join_step was not during the warm-up"
last=$(check_steps "$work/warm.0")
echo "elastic_membership: a join during warm-up at step $join_step; steps 1..$last"

# ---- 5. the rendezvous server killed (kill -9) and started again 10 s later on the same address
"$rdzv" --host 127.0.0.1 --port 0 --token-file "$token_file" >"$work/rdzv2.out" 2>&1 &
server=$!
pids+=("$server")
for _ in $(seq 100); do
  grep -qE '^listening on [^ ]+:[0-9]+$' "$work/rdzv2.out" && break
  sleep 0.1
done
endpoint2=$(grep -E '^listening on ' "$work/rdzv2.out" | head -1 | awk '{print $3}')
[ -n "$endpoint2" ] || fail "the second hsgd-rendezvous did not start: $(cat "$work/rdzv2.out")"
endpoint_saved=$endpoint
endpoint=$endpoint2
start outage "$work/outage.0" --nnodes 1:2 :: --epochs 80 "${h[@]}"
out0=$last_pid
wait_registered "$work/outage.0"
start outage "$work/outage.1" --nnodes 1:2 :: --epochs 80 "${h[@]}"
out1=$last_pid
endpoint=$endpoint_saved
wait_for_step "$work/outage.0" 40
kill -KILL "$server"
wait "$server" 2>/dev/null || true
at_kill=$(highest_step "$work/outage.0")
sleep 10
during=$(highest_step "$work/outage.0")
kill -0 "$out0" 2>/dev/null ||
  fail "the job ended before the server came back (step $during): it shows nothing; lengthen it"
"$rdzv" --host 127.0.0.1 --port "${endpoint2##*:}" --token-file "$token_file" >"$work/rdzv3.out" 2>&1 &
pids+=($!)
expect_exit "$out0" 0 "$work/outage.0"
expect_exit "$out1" 0 "$work/outage.1"
generations=$(grep -cE 'train_mlp: generation [0-9]+:' "$work/outage.0" || true)
[ "$generations" -eq 1 ] ||
  fail "the server outage changed the membership: $(grep -E 'train_mlp: generation' "$work/outage.0")"
[ "$during" -gt "$at_kill" ] ||
  fail "training stopped while the server was away (step $at_kill at the kill, $during 10 s later)"
last=$(check_steps "$work/outage.0")
echo "elastic_membership: the rendezvous server killed at step $at_kill and started again 10 s" \
  "later; training went on meanwhile (step $during), one generation throughout; steps 1..$last"
