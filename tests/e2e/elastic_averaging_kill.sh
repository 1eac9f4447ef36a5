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
# outer momentum (the generation lines say so), and the joiners start with a zero error-feedback
# residual: at most the 2 survivors keep theirs (none when the state is the one they left the
# interrupted ring with; both when it is an earlier snapshot with no averaging pending).
# Then a node joins a running job of 2 one-worker nodes with an overlapped bf16 world level (see
# there).
# Every process is started here and stopped by pid; each run is bounded by `timeout`.
set -euo pipefail
src=$1
build=$2
# shellcheck source=tests/e2e/e2e_lib.sh
source "$src/tests/e2e/e2e_lib.sh"
e2e_init elastic_averaging_kill

e2e_start_rendezvous

# $1 job id, $2 output, $3 fault spec ('' for none), $4 hierarchy, $5.. more train_mlp flags;
# --nnodes $nnodes, --nproc-per-node $nproc.
nnodes=1:2 nproc=2
start_node() {
  local id=$1 out=$2 fault=$3 hierarchy=$4
  HSGD_FAULT_KILL_IN_COLLECTIVE=$fault timeout 150 "$run" --nnodes "$nnodes" --nproc-per-node "$nproc" \
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
    grep -qE 'generation [1-9][0-9]*:.* joined node .*top level 8:4@.*: anchor and outer momentum from rank 0, error-feedback residuals kept on [0-2] of 4 ranks' \
      "$work/$name.0" || fail "$level: the join did not continue the top level's outer state:" \
      "$(grep generation "$work/$name.0" | head)"
  fi
  total=$(check_steps "$work/$name.0")
  [ "$(wc -l <<<"$fault")" -eq 1 ] || fail "$level: more than one worker killed itself: $fault"
  echo "elastic_averaging_kill: $(sed -E 's/.*SIGKILL in //; s/ \(HSGD.*//' <<<"$fault"):" \
    "node 0 kept its workers; node 1 rejoined with equal hashes; steps 1..$total once each"
done

# ---- a join into a running job with an overlapped bf16 world level with error feedback: nodes A
# and B of one worker each train (--nnodes 1:3), so that their replicas differ between
# averagings and their leaders' residuals hold rounding errors of the ring between them; then
# node C joins. Checked: the vote is at a step that starts the world's averaging (1, 9, 17, ...),
# which then completes at once for the join (else the replica hashes would differ); the top
# level's anchor and outer momentum come from rank 0; A and B keep their non-zero residuals and
# C starts at zero (kept on 2 of 3 ranks).
world_only="8:world@outer=0.5/0.5/nesterov,overlap=4,bf16,ef"
nnodes=1:3 nproc=1
start_node join "$work/join.a" "" "$world_only"
ja=$last_pid
wait_registered "$work/join.a"
start_node join "$work/join.b" "" "$world_only"
jb=$last_pid
for _ in $(seq 600); do
  grep -qE 'train_mlp: generation [0-9]+:.* 2 nodes, 2 workers' "$work/join.a" && break
  sleep 0.1
done
two=$(grep -E 'train_mlp: generation [0-9]+:.* 2 nodes, 2 workers' "$work/join.a") ||
  fail "join: nodes A and B did not form a generation within 60 s: $(grep -E 'generation' "$work/join.a")"
wait_for_step "$work/join.a" $(($(sed -E 's/.* at step ([0-9]+).*/\1/' <<<"$two") + 30))
start_node join "$work/join.c" "" "$world_only"
expect_exit "$ja" 0 "$work/join.a"
expect_exit "$jb" 0 "$work/join.b"
expect_exit "$last_pid" 0 "$work/join.c"
line=$(grep -E 'train_mlp: generation [0-9]+: joined node .* 3 nodes, 3 workers' "$work/join.a") ||
  fail "join: node C did not join: $(grep -E 'train_mlp: generation' "$work/join.a")"
grep -qE 'levels \{8:3\}.* received the state from rank 0 .* equal on all 3 ranks' <<<"$line" ||
  fail "join: not a join from rank 0's state with equal hashes: $line"
grep -qE "top level 8:3@outer=0.5/0.5/nesterov,overlap=4,bf16,ef: anchor and outer momentum from rank 0, error-feedback residuals kept on 2 of 3 ranks \(non-zero on 2\)" <<<"$line" ||
  fail "join: the top level's anchor, momentum and the survivors' residuals were not carried: $line"
join_step=$(sed -E 's/.* at step ([0-9]+).*/\1/' <<<"$line")
[ $(((join_step - 1) % 8)) -eq 0 ] ||
  fail "join: at step $join_step, not at a world averaging's start: $line"
total=$(check_steps "$work/join.a")
echo "elastic_averaging_kill: node C joined A and B's overlapped bf16 run at step $join_step with" \
  "equal hashes on 3 ranks, the top level's state and A's and B's residuals carried; steps" \
  "1..$total once each"
