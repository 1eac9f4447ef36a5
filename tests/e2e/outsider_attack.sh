#!/usr/bin/env bash
# Usage: outsider_attack.sh SOURCE_DIR BUILD_DIR
# An outsider without the token attacks a running job, and the job ends as if nobody had. The
# same DDP job of train_mlp (2 emulated nodes x 1 worker, 3 epochs, --seed 7, the same token file
# and job id) runs three times on scripts/emulated_cluster.sh:
#   1. unattacked, with tcpdump recording the link: the outsider's sniffed capture;
#   2. attacked: before the agents start (emulated_cluster.sh --hook), one outsider.py starts in
#      each node's namespace. It never reads the token file. On both nodes it races to every port
#      that starts listening during the job (the workers' process-group set-up) and connects
#      first with 256 random bytes, and replays there the client bytes of the capture's data-plane
#      connections. From node 1, across the link, it replays the capture's connections to the
#      rendezvous server and sends it random bytes, and store_outsider tries to write the failure
#      record hsgd-run/attempt/0/failed with a wrong token (TLS) and without one (plain TCP).
# Asserted: the attacked job exits 0 and both agents finish "after 0 restart(s)" with no attempt
# restarted; rank 0's losses, epoch lines and final accuracy equal the unattacked run's; and the
# outsider did attack: it connected to a set-up port on each node, its replays reached the data
# plane and the rendezvous server (every one closed or reset by the job, and each rank logged
# refusing at least two connections), and both store writes were refused.
#   3. The control: the same job run --insecure takes store_outsider's plain write, and both
#      agents stop the job naming it, so the record is one the agents act on.
# Exit 77 (skip) without root, network namespaces or tcpdump.
set -euo pipefail
src=$1
build=$2
# shellcheck source=tests/e2e/e2e_lib.sh
source "$src/tests/e2e/e2e_lib.sh"
e2e_init outsider_attack
unset HSGD_TOKEN_FILE  # the job gets the token through emulated_cluster.sh --token-file
[ "$(id -u)" -eq 0 ] ||
  { echo "outsider_attack: SKIPPED: needs root (network namespaces, tcpdump)"; exit 77; }
need_tcpdump

subnet=10.79.2
port=29502
job="attacked-job"

cluster_pid=""
e2e_cleanup() {
  # SIGTERM: emulated_cluster.sh removes its namespaces, with the outsiders in them.
  if [ -n "$cluster_pid" ]; then kill -TERM "$cluster_pid" 2>/dev/null || true; fi
  if [ -n "$cluster_pid" ]; then wait "$cluster_pid" 2>/dev/null || true; fi
}

# The hook: one outsider per node, started in its namespace; returns once both are watching.
cat >"$work/hook.sh" <<HOOK
set -eu
read -r ns0 ns1 <<<"\$EMU_NAMESPACES"
read -r addr0 _ <<<"\$EMU_ADDRS"
outsider=(python3 "$src/tests/e2e/outsider.py" --rdzv "\$addr0:\$EMU_PORT"
          --replay "$work/clean.pcap")
ip netns exec "\$ns0" "\${outsider[@]}" --log "$work/outsider0.log" --ready "$work/ready0" \\
  >"$work/outsider0.out" 2>&1 &
ip netns exec "\$ns1" "\${outsider[@]}" --log "$work/outsider1.log" --ready "$work/ready1" \\
  --rdzv-attacks --store-outsider "$build/tests/e2e/store_outsider" --job "\$EMU_JOB_ID" \\
  >"$work/outsider1.out" 2>&1 &
for _ in \$(seq 300); do
  [ -e "$work/ready0" ] && [ -e "$work/ready1" ] && exit 0
  sleep 0.1
done
echo "the outsiders did not start within 30 s: \$(cat "$work"/outsider*.out)" >&2
exit 1
HOOK

# $1: name, rest: more emulated_cluster.sh flags. Runs the job into $work/$1.out; sets rc.
run_cluster() {
  local name=$1
  shift
  rc=0
  "$src/scripts/emulated_cluster.sh" --rate 1gbit --nproc-per-node 1 --subnet "$subnet" \
    --port "$port" --timeout 60 --build "$build" --job-id "$job" "$@" \
    -- "$mlp" --synthetic --epochs 3 --lr 0.0005 --log-every 8 --mode ddp --seed 7 --hidden 32 \
    >"$work/$name.out" 2>&1 &
  cluster_pid=$!
  wait "$cluster_pid" || rc=$?
  cluster_pid=""
  if [ "$rc" -eq 77 ]; then
    cat "$work/$name.out"
    echo "outsider_attack: SKIPPED: network namespaces are not available"
    exit 77
  fi
}
# $1: name (clean or attacked), rest: more emulated_cluster.sh flags. The job over TLS must end
# well, without a restart.
run_job() {
  local name=$1 out="$work/$1.out"
  run_cluster "$@" --token-file "$token_file"
  [ "$rc" -eq 0 ] || fail "the $name job exited $rc, expected 0: $(tail -n 30 "$out")"
  [ "$(grep -c "finished: all workers of all nodes exited 0 after 0 restart(s)" "$out")" -eq 2 ] ||
    fail "the $name job's agents did not both finish after 0 restart(s): $(tail -n 30 "$out")"
  if grep -Eq "restarting all nodes|attempt [1-9]" "$out"; then
    fail "the $name job restarted: $(grep -E "restarting all nodes|attempt [1-9]" "$out")"
  fi
}
# Rank 0's results: the loss every 8 steps, the epoch lines without their time and throughput,
# and the final line. (A low --lr keeps them off 100% and 0.0000, where any run would agree.)
results() {
  { grep -Eo '^\[rank 0\] +step [0-9]+ loss [0-9.]+' "$1"
    grep -E '^\[rank 0\] +[1-3] +[0-9]+ +[0-9.]+ ' "$1" | awk '{print $3, $4, $5, $6, $7, $8}'
    grep -E '^\[rank 0\] final test accuracy: ' "$1"; } || true
}

# ---- 1. unattacked, sniffed
run_job clean --capture "$work/clean.pcap"
clean=$(results "$work/clean.out")
# 2 ranks of 64 steps an epoch: 24 loss lines, 3 epoch lines, the final line.
[ "$(echo "$clean" | wc -l)" -eq 28 ] ||
  fail "not 24 loss lines, 3 epoch lines and the final accuracy in the clean run: $clean"

# ---- 2. attacked
run_job attacked --hook "bash $work/hook.sh"
attacked=$(results "$work/attacked.out")
echo "---- the outsider's attempts"
cat "$work/outsider0.log" "$work/outsider1.log"
[ "$attacked" = "$clean" ] ||
  fail "the attacked run's results differ: attacked '$attacked', unattacked '$clean'"
echo "---- rank 0's results, the same unattacked and attacked"
echo "$attacked" | tail -n 4

# The outsider attacked: counted from its own log, so that the test cannot pass on no attack.
count() { grep -cE "$2" "$1" || true; }
grep -qE '^capture: [0-9]+ rendezvous and [1-9][0-9]* data-plane' "$work/outsider0.log" ||
  fail "the sniffed capture holds no data-plane connection: $(head -1 "$work/outsider0.log")"
for k in 0 1; do
  log=$work/outsider$k.log
  [ "$(count "$log" '^race .* connected, sent 256$')" -ge 1 ] ||
    fail "the outsider on node $k connected to no set-up port: $(cat "$log")"
  [ "$(count "$log" '^replay-data .* connected$')" -ge 1 ] ||
    fail "no replay on node $k reached the data plane: $(cat "$log")"
  [ "$(count "$log" '^replay-data .* sent [1-9][0-9]*, got [0-9]+, (closed|reset)$')" -ge 1 ] ||
    fail "no replay on node $k was closed by the data plane: $(cat "$log")"
  if grep -E '^replay-data .*open after' "$log"; then
    fail "the job kept a replayed data-plane connection open"
  fi
done
# ... and the job saw them: each rank's data plane refused the random bytes and the replay.
for r in 0 1; do
  refused="^\[rank $r\] .*TLS transport: refused a connection from"
  [ "$(count "$work/attacked.out" "$refused")" -ge 2 ] ||
    fail "rank $r's data plane did not refuse both the race and the replay"
done
log=$work/outsider1.log
replays=$(count "$log" '^replay-rdzv .* sent [1-9][0-9]*, got [0-9]+, (closed|reset)$')
streams=$(sed -nE 's/^capture: ([0-9]+) rendezvous .*/\1/p' "$log")
[ "${streams:-0}" -ge 1 ] || fail "the capture holds no connection to the rendezvous server"
[ "$replays" -eq "$streams" ] ||
  fail "$replays of $streams replays to the rendezvous server were closed by it: $(cat "$log")"
[ "$(count "$log" '^garbage-rdzv .* sent 256, got [0-9]+, (closed|reset)$')" -eq 1 ] ||
  fail "random bytes to the rendezvous server were not closed: $(cat "$log")"
for mode in wrong-token no-token; do
  [ "$(count "$log" "^store $mode exit 0: refused \\($mode\\)")" -eq 1 ] ||
    fail "the store write $mode was not refused: $(grep "^store $mode" "$log" || echo none)"
done

# ---- 3. the control: the job run --insecure takes the outsider's record and stops
# The same write without a token, before the agents start, goes in, and both agents end the job
# naming it as the root cause: the record is the one the agents act on.
cat >"$work/control_hook.sh" <<HOOK
read -r _ ns1 <<<"\$EMU_NAMESPACES"
read -r addr0 _ <<<"\$EMU_ADDRS"
ip netns exec "\$ns1" "$build/tests/e2e/store_outsider" "\$addr0" "\$EMU_PORT" "\$EMU_JOB_ID" \\
  no-token >"$work/control.store" || true
HOOK
run_cluster control --insecure --hook "bash $work/control_hook.sh"
grep -q "^WROTE hsgd-run/attempt/0/failed" "$work/control.store" ||
  fail "the plain write did not go into the insecure job's store: $(cat "$work/control.store")"
[ "$rc" -ne 0 ] || fail "the insecure job exited 0 with an outsider's failure record"
[ "$(grep -c "Root cause: .*(an outsider's record)" "$work/control.out")" -eq 2 ] ||
  fail "the insecure job's agents did not both stop on the record: $(tail -n 9 "$work/control.out")"
echo "outsider_attack: passed"
