#!/usr/bin/env bash
# Usage: elastic_server_restart.sh SOURCE_DIR BUILD_DIR
# The rendezvous server killed during a membership change, on loopback: four hsgd-runs
# (--nnodes 2:4, one train_mlp worker each, hierarchical 2:node,8:world, default timeouts) train on
# one hsgd-rendezvous. At step 40 node B (the second to register) is killed with SIGKILL (its
# hsgd-run and its worker), the server 0.3 s later; B's command is started again 5 s after the
# kill, the server on the same port 10 s after it. The server comes back empty and the live
# clients re-publish the job; B's share of the slots counter is lost with it.
# Checked:
#   - no live node is dropped: the only incarnation any hsgd-run reports gone is B's first one;
#   - the restarted B joins, and the job ends with all 4 nodes (rank 0's last generation has 4
#     nodes and 4 workers; every hsgd-run exits 0);
#   - rank 0 (node A, never killed) prints steps 1..N once each.
# Printed: the time from the kill to the generation with 4 nodes again (node A's hsgd-run's line),
# and the slots the incarnations registered at (an incarnation whose slot another one took while
# the server's counter was low registers again). Every process is
# started here and stopped by pid; each run is bounded by `timeout`.
set -euo pipefail
src=$1
build=$2
# shellcheck source=tests/e2e/e2e_lib.sh
source "$src/tests/e2e/e2e_lib.sh"
e2e_init elastic_server_restart

e2e_start_rendezvous
server=$rdzv_pid
port=${endpoint##*:}

# $1 output. Sets last_pid.
start_node() {
  timeout 200 "$run" --nnodes 2:4 --nproc-per-node 1 --rdzv-endpoint "$endpoint" \
    --rdzv-id restart --rdzv-last-call 1 --max-restarts 0 -- "$mlp" --synthetic --epochs 40 \
    --log-every 1 --lr 0.02 --mode hierarchical --hierarchy 2:node,8:world >"$1" 2>&1 &
  pids+=($!)
  last_pid=$!
}

nodes=(a b c d)
declare -A agent
for n in "${nodes[@]}"; do
  start_node "$work/$n"
  agent[$n]=$last_pid
  wait_registered "$work/$n"
done
wait_for_line "$work/a" 'train_mlp: generation [0-9]+:.* 4 nodes, 4 workers' \
  "the 4 nodes did not form a generation"
wait_for_step "$work/a" 40
b_run=$(hsgd_run_of "${agent[b]}")
b_id=$(node_id_of "$work/b")
read -r -a b_procs <<<"$b_run $(workers_of "$b_run")"
kill -KILL "${b_procs[@]}"
killed_at=$(date +%H:%M:%S.%N)
wait "${agent[b]}" 2>/dev/null || true
sleep 0.3
kill -KILL "$server"
wait "$server" 2>/dev/null || true
sleep 4.7
start_node "$work/b2"
agent[b2]=$last_pid
sleep 5
e2e_start_rendezvous 127.0.0.1 "$port"

for n in a c d b2; do expect_exit "${agent[$n]}" 0 "$work/$n"; done

# Gone: only B's first incarnation, in every hsgd-run's log.
gone=$(grep -hoE "node [^ ]+ \('[^']*'\) is gone|node [^ ]+ \('[^']*'\)[^:]*: it left the job" \
  "$work/a" "$work/c" "$work/d" "$work/b2" | awk '{print $2}' | sort -u | tr '\n' ' ')
[ "$gone" = "$b_id " ] || fail "incarnations reported gone: '$gone', expected only B's first ($b_id)"
b2_id=$(node_id_of "$work/b2")
[ -n "$b2_id" ] || fail "the restarted B did not register: $(tail -n 5 "$work/b2")"
grep -qE "train_mlp: generation [0-9]+:.*joined node [^ ]+ \($b2_id\)" "$work/a" ||
  fail "the restarted B ($b2_id) did not join: $(grep -h 'train_mlp: generation' "$work/a" | tail -n 3)"
last_gen=$(grep -hE 'train_mlp: generation [0-9]+:' "$work/a" | tail -n 1)
grep -qE ' 4 nodes, 4 workers' <<<"$last_gen" || fail "the job did not end with all 4 nodes: $last_gen"
grep -qE 'train_mlp: elastic, [0-9]+ generations, 4 ranks at the end' "$work/a" ||
  fail "rank 0's summary does not say 4 ranks at the end: $(grep -h 'train_mlp: elastic' "$work/a")"
last=$(check_steps "$work/a")
back_at=$(grep -hE "hsgd-run: generation [0-9]+: 4 nodes, 4 workers: .*$b2_id" "$work/a" | head -n 1 |
  grep -oE '^\[[0-9:.]+\]' | tr -d '[]')
took=$(awk -v a="$killed_at" -v b="$back_at" 'function s(t, p) { split(t, p, ":"); return p[1] * 3600 + p[2] * 60 + p[3] }
  BEGIN { printf "%.1f", s(b) - s(a) }')
echo "elastic_server_restart: B killed at step 40 and the server 0.3 s later; B started again at" \
  "+5 s, the server at +10 s; only $b_id left; $b2_id joined; 4 nodes again $took s after the" \
  "kill; $last_gen; steps 1..$last once each"
echo "elastic_server_restart: registrations: $(grep -hoE "node [^ ]+ \('[^']*'\) registered \(slot [0-9]+|node [^ ]+ registered again at slot [0-9]+" \
  "$work/a" "$work/b" "$work/c" "$work/d" "$work/b2" | sed -E "s/ \('[^']*'\)//; s/^node //" | tr '\n' ';')"
