#!/usr/bin/env bash
# Nodes with different numbers of workers, under the real launcher: one
# hsgd-rendezvous and two hsgd-run agents on loopback, node 0 with --nproc-per-node 3 and node 1
# with 1, running train_mlp --mode local-sgd (post_localSGD_hook with its default intra-node
# subgroup, periodic averaging) for a few steps on the synthetic data set. Checks that both
# agents exit 0, rank 0 reports a final accuracy, and the hook's intra-node groups are the
# nodes' members: 3 ranks on node 0, 1 on node 1 (hsgd's debug log line at registration).
# Usage: uneven_nodes_test.sh BUILD_DIR
set -euo pipefail
build=$1
run=$build/apps/hsgd-run/hsgd-run
server=$build/apps/hsgd-rendezvous/hsgd-rendezvous
mlp=$build/apps/train_mlp/train_mlp
tmp=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# The job's token, in a 0600 file that the server and both agents read (HSGD_TOKEN_FILE).
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$tmp/token")
export HSGD_TOKEN_FILE=$tmp/token
"$server" --host 127.0.0.1 --port 0 --token-file "$tmp/token" > "$tmp/server.log" 2>&1 &
pids+=("$!")
disown "$!"  # killed by cleanup; no "Killed" notice from the shell
deadline=$((SECONDS + 30))
until port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/server.log" | head -1) &&
      [ -n "$port" ]; do
  [ $SECONDS -le $deadline ] || { cat "$tmp/server.log"; echo "server did not start"; exit 1; }
  sleep 0.05
done

train=("$mlp" --synthetic --mode local-sgd --period 2 --warmup-steps 2 --max-steps 8
       --epochs 1 --hidden 32 --log-every 4)
nproc=(3 1)
for node in 0 1; do
  HSGD_LOG_LEVEL=debug "$run" --nnodes 2 --node-rank "$node" --nproc-per-node "${nproc[$node]}" \
    --rdzv-endpoint "127.0.0.1:$port" --rdzv-id uneven --rdzv-timeout 60 -- "${train[@]}" \
    > "$tmp/node$node.log" 2>&1 &
  pids+=("$!")
done
status=0
for node in 0 1; do
  pid=${pids[$((node + 1))]}
  # Both agents within 80 s each (ctest's TIMEOUT is 180); a hung agent is killed, not waited for.
  timeout 80 tail --pid="$pid" -f /dev/null || kill -9 "$pid" 2>/dev/null || true
  set +e
  wait "$pid"
  rc=$?
  set -e
  if [ "$rc" -ne 0 ]; then
    echo "--- node $node (--nproc-per-node ${nproc[$node]}) exited $rc ---"
    cat "$tmp/node$node.log"
    status=1
  fi
done
[ "$status" -eq 0 ] || exit 1
grep -q "final test accuracy:" "$tmp/node0.log" ||
  { cat "$tmp/node0.log"; echo "rank 0 reported no final accuracy"; exit 1; }
# The registration line of each rank: 3 on node 0 with a group of 3, 1 on node 1 alone.
for node in 0 1; do
  n=$(grep -c "local SGD starts after 2 iterations (subgroup of ${nproc[$node]} ranks)" \
        "$tmp/node$node.log" || true)
  [ "$n" -eq "${nproc[$node]}" ] || {
    grep "local SGD starts" "$tmp/node$node.log" || true
    echo "node $node: $n ranks with an intra-node group of ${nproc[$node]}, expected ${nproc[$node]}"
    exit 1
  }
done
echo "2 nodes of 3 and 1 workers: local SGD with each node's intra-node group, exit 0"
