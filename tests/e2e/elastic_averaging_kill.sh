#!/usr/bin/env bash
# Usage: elastic_averaging_kill.sh SOURCE_DIR BUILD_DIR
# A peer killed inside an averaging, at each level of an elastic hierarchical job on loopback:
# two hsgd-runs (--nnodes 1:2) of 2 workers each, train_mlp with --hierarchy 2:node,8:world on
# synthetic data. A worker of node 1 kills itself (SIGKILL) as the 3rd collective of the given
# description starts (HSGD_FAULT_KILL_IN_COLLECTIVE, first incarnation only), so that its peers
# meet the loss inside that collective:
#   - node level ('averager 2:2', local rank 1): its node peer is in the averaging, node 0 not;
#   - world level ('averager 8:4', local rank 1): node 0's workers are in the same averaging;
#   - a world level with the outer optimizer and bf16 with error feedback
#     (2:node,8:world@outer=0.5/0.5/nesterov,bf16,ef): node 1's leader (local rank 0) in the
#     leaders' bf16 ring ('compressed averaging: reduce-scatter');
#   - the same with overlap=4 (@outer=0.5/0.5/nesterov,overlap=4,bf16,ef): the ring runs in the
#     background while the next steps train; the join completes the averaging in flight at once.
# Each time: the fault line names that collective; node 0's workers are the same processes
# throughout; rank 0 reports the lost node and the restarted node's join with equal replica
# hashes on all 4 ranks (train_mlp fails the job if they differ, so a half-applied averaging
# would stop it); both hsgd-runs exit 0; rank 0's steps run 1..N once each. With the outer
# optimizer, every generation after the first continues the top level from rank 0's anchor and
# outer momentum (the generation lines say so).
# Every process is started here and stopped by pid; each run is bounded by `timeout`.
set -euo pipefail
src=$1
build=$2
# shellcheck source=tests/e2e/e2e_lib.sh
source "$src/tests/e2e/e2e_lib.sh"
e2e_init elastic_averaging_kill

e2e_start_rendezvous

# $1 job id, $2 output, $3 fault spec ('' for none), $4 hierarchy, $5.. more train_mlp flags.
start_node() {
  local id=$1 out=$2 fault=$3 hierarchy=$4
  HSGD_FAULT_KILL_IN_COLLECTIVE=$fault timeout 150 "$run" --nnodes 1:2 --nproc-per-node 2 \
    --rdzv-endpoint "$endpoint" --rdzv-id "$id" --rdzv-last-call 1 --heartbeat-timeout 3 \
    --max-restarts 1 -- "$mlp" --synthetic --epochs 12 --log-every 1 --lr 0.05 \
    --mode hierarchical --hierarchy "$hierarchy" "${@:5}" >"$out" 2>&1 &
  pids+=($!)
  last_pid=$!
}

plain="2:node,8:world"
options="2:node,8:world@outer=0.5/0.5/nesterov,bf16,ef"
overlap="2:node,8:world@outer=0.5/0.5/nesterov,overlap=4,bf16,ef"
for case in "node|averager 2:2|1|$plain" "world|averager 8:4|1|$plain" \
  "options|compressed averaging: reduce-scatter|0|$options" \
  "overlap|compressed averaging: reduce-scatter|0|$overlap"; do
  IFS='|' read -r name level local hierarchy <<<"$case"
  start_node "$name" "$work/$name.0" "" "$hierarchy"
  t0=$last_pid
  wait_registered "$work/$name.0"
  start_node "$name" "$work/$name.1" "$level#3@$local" "$hierarchy"
  t1=$last_pid
  run0=$(hsgd_run_of "$t0")
  wait_for_step "$work/$name.0" 2
  before=$(workers_of "$run0")
  for _ in $(seq 600); do
    grep -qE '^\[rank [0-9]+\] hsgd fault injection: SIGKILL' "$work/$name.1" && break
    sleep 0.1
  done
  fault=$(grep -hE '^\[rank [0-9]+\] hsgd fault injection: SIGKILL' "$work/$name.1") ||
    fail "$level: no worker of node 1 killed itself within 60 s: $(tail -n 20 "$work/$name.1")"
  grep -q "'$level'" <<<"$fault" || fail "$level: the kill was not in that level's averaging: $fault"
  wait_for_step "$work/$name.0" 300
  after=$(workers_of "$run0")
  [ "$before" = "$after" ] || fail "$level: node 0's workers changed: '$before' then '$after'"
  rc0=0 rc1=0
  wait "$t0" || rc0=$?
  wait "$t1" || rc1=$?
  [ "$rc0" -eq 0 ] || fail "$level: node 0's hsgd-run exited $rc0: $(tail -n 30 "$work/$name.0")"
  [ "$rc1" -eq 0 ] || fail "$level: node 1's hsgd-run exited $rc1: $(tail -n 30 "$work/$name.1")"
  grep -qE 'generation [0-9]+:.* lost node' "$work/$name.0" ||
    fail "$level: rank 0 did not report the lost node: $(grep generation "$work/$name.0" | head)"
  grep -qE 'generation [0-9]+:.* joined node .* equal on all 4 ranks' "$work/$name.0" ||
    fail "$level: rank 0 did not report the join: $(grep generation "$work/$name.0" | head)"
  if [ "$name" = options ] || [ "$name" = overlap ]; then
    grep -qE 'generation [1-9][0-9]*:.* joined node .*top level 8:4@.*: anchor and outer momentum from rank 0' \
      "$work/$name.0" || fail "$level: the join did not continue the top level's outer state:" \
      "$(grep generation "$work/$name.0" | head)"
  fi
  total=$(check_steps "$work/$name.0")
  [ "$(wc -l <<<"$fault")" -eq 1 ] || fail "$level: more than one worker killed itself: $fault"
  echo "elastic_averaging_kill: $(sed -E 's/.*SIGKILL in //; s/ \(HSGD.*//' <<<"$fault"):" \
    "node 0 kept its workers; node 1 rejoined with equal hashes; steps 1..$total once each"
done

# ---- a join while node 0 trains alone with an overlapped world level (8:world, no node level,
# so that the world level is kept on node 0's 2 ranks; --subgroup-size 1: no gradient averaging
# within the node, so that its replicas differ between averagings): the vote is at a step that
# starts the world's averaging (steps 1, 9, 17, ...), which then completes at once for the join
# (else rank 1 would keep its own model and the replica hashes would differ).
world_only="8:world@outer=0.5/0.5/nesterov,overlap=4,bf16,ef"
start_node join "$work/join.0" "" "$world_only" --subgroup-size 1
j0=$last_pid
wait_for_step "$work/join.0" 30
grep -qE 'train_mlp: generation 0: 1 nodes, 2 workers, levels \{8:2\}' "$work/join.0" ||
  fail "join: generation 0 is not node 0 alone with the world level: $(grep -E 'train_mlp: generation' "$work/join.0")"
start_node join "$work/join.1" "" "$world_only" --subgroup-size 1
expect_exit "$j0" 0 "$work/join.0"
expect_exit "$last_pid" 0 "$work/join.1"
line=$(grep -E 'train_mlp: generation 1: joined node' "$work/join.0") ||
  fail "join: no join in generation 1: $(grep -E 'train_mlp: generation' "$work/join.0")"
grep -qE 'levels \{8:4\}.* received the state from rank 0 .* equal on all 4 ranks' <<<"$line" ||
  fail "join: not a join from rank 0's state with equal hashes: $line"
join_step=$(sed -E 's/.* at step ([0-9]+).*/\1/' <<<"$line")
if [ $(((join_step - 1) % 8)) -ne 0 ] || [ "$join_step" -le 30 ]; then
  fail "join: at step $join_step, not at a world averaging's start after step 30: $line"
fi
total=$(check_steps "$work/join.0")
echo "elastic_averaging_kill: node 1 joined node 0's overlapped run at step $join_step with" \
  "equal hashes on 4 ranks; steps 1..$total once each"
