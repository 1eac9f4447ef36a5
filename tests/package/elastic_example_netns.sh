#!/usr/bin/env bash
# Usage: elastic_example_netns.sh SOURCE_DIR BUILD_DIR PACKAGE_BUILD_DIR
# docs/elastic.md's "Your own program" (the README's program made elastic and durable, built
# against the exported package) on 3 nodes in network namespaces: each node a namespace with one
# veth to a bridge (tbf at 50 Mbit/s on both ends, so that the warm-up's gradient allreduces take
# seconds), the rendezvous server in node 0's, one hsgd-run --nnodes 2:3 of one worker per node,
# all in one working directory (a shared file system: the checkpoints go to ckpt/). Once the 3
# nodes train, node 2's hsgd-run and worker are killed with SIGKILL; node 2's command is started
# again 3 s later.
# Checked:
#   - the survivors go on without a restart: nodes 0 and 1 keep the same worker processes until
#     the end, and their hsgd-runs report 0 restarts;
#   - node 2 rejoins: node 0's hsgd-run adopts a generation of 3 nodes that holds node 2's new
#     incarnation;
#   - every hsgd-run exits 0 and the three workers print the same replica hash at the same step.
# Skipped (77), saying why, without root or network namespaces. Everything started here is
# stopped by pid and the namespaces are removed, also on failure.
set -euo pipefail
src=$1
build=$2
package=$3
tag=hsgdex$$
ns=("${tag}0" "${tag}1" "${tag}2")
hub="${tag}h"
subnet=10.$((100 + $$ % 100)).$(($$ % 250)).
# shellcheck source=tests/e2e/e2e_lib.sh
source "$src/tests/e2e/e2e_lib.sh"
e2e_init elastic_example_netns
program=$package/elastic_example
[ -x "$program" ] || fail "$program was not built (package_find_package builds it)"
e2e_cleanup() {
  local n
  for n in "${ns[@]}" "$hub"; do ip netns del "$n" 2>/dev/null || true; done
}

if [ "$(id -u)" -ne 0 ] || ! ip netns add "$hub" 2>"$work/netns.err"; then
  echo "elastic_example_netns: skipped: cannot create network namespaces (root: $(id -u);" \
    "$(cat "$work/netns.err" 2>/dev/null))"
  exit 77
fi
ip -n "$hub" link add br0 type bridge
ip -n "$hub" link set br0 up
for k in 0 1 2; do
  ip netns add "${ns[$k]}"
  ip -n "${ns[$k]}" link set lo up
  ip link add veth0 netns "${ns[$k]}" type veth peer name "p$k" netns "$hub"
  ip -n "$hub" link set "p$k" master br0
  ip -n "$hub" link set "p$k" up
  ip -n "${ns[$k]}" addr add "${subnet}$((k + 1))/24" dev veth0
  ip -n "${ns[$k]}" link set veth0 up
  tc -n "${ns[$k]}" qdisc add dev veth0 root tbf rate 50mbit burst 64kb latency 100ms
  tc -n "$hub" qdisc add dev "p$k" root tbf rate 50mbit burst 64kb latency 100ms
done
e2e_start_rendezvous "${subnet}1" 29400 "${ns[0]}"

cd "$work"
declare -A agent
# $1 node, $2 output.
start_node() {
  ip netns exec "${ns[$1]}" timeout 250 "$run" --nnodes 2:3 --nproc-per-node 1 \
    --rdzv-endpoint "$endpoint" --rdzv-last-call 3 --rdzv-id netns -- "$program" >"$2" 2>&1 &
  pids+=($!)
  agent[$2]=$!
}
for k in 0 1 2; do
  start_node "$k" "$work/node$k"
  wait_registered "$work/node$k"
done
three='hsgd-run: generation [0-9]+: 3 nodes, 3 workers'
wait_for_line "$work/node0" "$three" "the 3 nodes did not form a generation"
sleep 3
run0=$(hsgd_run_of "${agent[$work/node0]}")
run1=$(hsgd_run_of "${agent[$work/node1]}")
before0=$(workers_of "$run0")
before1=$(workers_of "$run1")
run2=$(hsgd_run_of "${agent[$work/node2]}")
read -r -a victims <<<"$run2 $(workers_of "$run2")"
kill -KILL "${victims[@]}"
wait "${agent[$work/node2]}" 2>/dev/null || true
sleep 3
start_node 2 "$work/node2.again"
wait_registered "$work/node2.again"
new_id=$(node_id_of "$work/node2.again")
wait_for_line "$work/node0" "$three: .*$new_id" "node 2 ($new_id) did not rejoin"
after0=$(workers_of "$run0")
after1=$(workers_of "$run1")
[ "$before0" = "$after0" ] && [ "$before1" = "$after1" ] ||
  fail "a survivor's workers changed: node 0 '$before0' then '$after0', node 1 '$before1' then '$after1'"
for f in node0 node1 node2.again; do expect_exit "${agent[$work/$f]}" 0 "$work/$f"; done
for f in node0 node1; do
  grep -qE "this node ends with exit code 0: .*\(0 restart\(s\) of this node\)" "$work/$f" ||
    fail "$f restarted its workers: $(grep -h 'ends with exit code' "$work/$f")"
done
hashes=$(grep -hoE 'replica hash [0-9]+ at step [0-9]+' "$work/node0" "$work/node1" "$work/node2.again" | sort -u)
[ "$(grep -c . <<<"$hashes")" -eq 1 ] ||
  fail "the replicas differ at the end (or a node printed none): $(grep -hE 'replica hash' "$work"/node* | head)"
[ "$(cat "$work/node0" "$work/node1" "$work/node2.again" | grep -cE 'replica hash')" -eq 3 ] ||
  fail "not every worker printed its replica hash"
echo "elastic_example_netns: 3 nodes in namespaces at 50 Mbit/s; node 2 killed and started" \
  "again; nodes 0 and 1 kept their workers; node 2 rejoined as $new_id; $hashes on all 3 workers"
