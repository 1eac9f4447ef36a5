#!/usr/bin/env bash
# Usage: traffic_capture.sh SOURCE_DIR BUILD_DIR
# What an eavesdropper on the link between two nodes sees of a job. The same DDP job of
# train_mlp (2 emulated nodes x 1 worker, --seed 7) runs twice on scripts/emulated_cluster.sh
# with tcpdump recording the link in node 1's namespace (every packet between the nodes: node 1's
# agent and worker with the rendezvous server on node 0, and the data plane between the ranks):
#   1. with --insecure (plain TCP): the capture holds the store's key names and runs of 16
#      float32 values of the model's initial weights (DDP broadcasts them from rank 0), which
#      shows that the capture and the needles find what crosses the link;
#   2. over TLS keyed by a token file: the job trains as well, the capture holds its connections
#      and megabytes, and none of those needles, nor the token (its hex text or the 32 bytes it
#      encodes).
# The needles: capture_needles.py; the weights: initial_weights (models::MLP from the same seed).
# Exit 77 (skip) without root, network namespaces or tcpdump.
set -euo pipefail
src=$1
build=$2
# shellcheck source=tests/e2e/e2e_lib.sh
source "$src/tests/e2e/e2e_lib.sh"
e2e_init traffic_capture
unset HSGD_TOKEN_FILE  # the job gets the token through emulated_cluster.sh --token-file
[ "$(id -u)" -eq 0 ] ||
  { echo "traffic_capture: SKIPPED: needs root (network namespaces, tcpdump)"; exit 77; }
need_tcpdump

seed=7
hidden=64,32
"$build/tests/e2e/initial_weights" --seed "$seed" --hidden "$hidden" --out "$work/weights.f32"
# The agents' keys, and the process group's (after the job id, which the TLS identity names in
# clear: job ids are names, not secrets).
key_names=(hsgd-run/attempt/0/ /rdzv/node/ /pg/gloo/ /pg/arrived/)
keys=()
for key in "${key_names[@]}"; do keys+=(--key "$key"); done

# Rank r starts from seed + r. DDP broadcasts rank 0's initial weights only when the ranks hold
# different values (docs/averaging.md), and that broadcast across the link is what the plain
# capture must show.
per_rank_seed=$work/per_rank_seed.sh
cat >"$per_rank_seed" <<WRAPPER
#!/usr/bin/env bash
exec "$mlp" "\$@" --seed \$(( $seed + \${RANK:?hsgd-run sets RANK} ))
WRAPPER
chmod +x "$per_rank_seed"

cluster_pid=""
e2e_cleanup() {
  # SIGTERM: emulated_cluster.sh removes its namespaces and stops the job.
  if [ -n "$cluster_pid" ]; then kill -TERM "$cluster_pid" 2>/dev/null || true; fi
  if [ -n "$cluster_pid" ]; then wait "$cluster_pid" 2>/dev/null || true; fi
}

# $1: tls or insecure. Runs the job with a capture into $work/$1.pcap and scans it into
# $work/$1.needles.
run_job() {
  local mode=$1 out="$work/$1.out" rc attempt
  local security=(--token-file "$token_file")
  [ "$mode" = insecure ] && security=(--insecure)
  # A capture with holes could miss a needle: one in which the kernel dropped packets (a busy
  # machine) is taken again, up to 3 times. 1024 examples (8 steps a rank) keep it small.
  for attempt in 1 2 3; do
    rc=0
    "$src/scripts/emulated_cluster.sh" --rate 1gbit --nproc-per-node 1 --subnet 10.79.1 \
      --port 29501 --timeout 50 --build "$build" "${security[@]}" --capture "$work/$mode.pcap" \
      -- "$per_rank_seed" --synthetic --train-subset 1024 --epochs 1 --mode ddp \
      --hidden "$hidden" >"$out" 2>&1 &
    cluster_pid=$!
    wait "$cluster_pid" || rc=$?
    cluster_pid=""
    if [ "$rc" -eq 77 ]; then
      cat "$out"
      echo "traffic_capture: SKIPPED: network namespaces are not available"
      exit 77
    fi
    [ "$rc" -eq 0 ] || fail "the $mode job exited $rc, expected 0: $(tail -n 20 "$out")"
    grep -Eq "capture .*: [1-9][0-9]* packets captured, 0 dropped by the kernel" "$out" && break
    echo "traffic_capture: $mode run $attempt: $(grep 'capture' "$out"); again"
  done
  grep -Eq "capture .*: [1-9][0-9]* packets captured, 0 dropped by the kernel" "$out" ||
    fail "the $mode capture is incomplete 3 times: $(grep 'capture' "$out")"
  grep -Eq '^\[rank 0\] final test accuracy: ' "$out" ||
    fail "the $mode job printed no final test accuracy: $(tail -n 20 "$out")"
  python3 "$src/tests/e2e/capture_needles.py" "$work/$mode.pcap" --token-file "$token_file" \
    --weights "$work/weights.f32" "${keys[@]}" >"$work/$mode.needles" ||
    fail "capture_needles.py failed on the $mode capture"
  echo "---- $mode"
  cat "$work/$mode.needles"
}

# From scan $1: how many needles of kind $2 were found, of how many ("NAME: FOUND/TOTAL ...");
# the TCP connections seen open, and the bytes they carried.
found() { sed -nE "s|^$2: ([0-9]+)/[0-9]+.*|\\1|p" "$1"; }
total() { sed -nE "s|^$2: [0-9]+/([0-9]+).*|\\1|p" "$1"; }
payload() { sed -nE 's/^connections: [0-9]+, payload bytes ([0-9]+).*/\1/p' "$1"; }
connections() { sed -nE 's/^connections: ([0-9]+),.*/\1/p' "$1"; }

# ---- 1. insecure: the needles are found
run_job insecure
plain=$work/insecure.needles
for key in "${key_names[@]}"; do
  [ "$(found "$plain" "key:$key")" = 1 ] ||
    fail "the plain capture lacks key text '$key': the capture or the scan is broken"
done
# A needle can straddle two packets: most, not all, must be found.
w_found=$(found "$plain" weights)
w_total=$(total "$plain" weights)
[ "$w_total" -ge 32 ] || fail "only $w_total weight needles"
[ $((2 * w_found)) -ge "$w_total" ] ||
  fail "the plain capture holds $w_found of $w_total runs of the initial weights, expected half"

# ---- 2. TLS: none is found
run_job tls
sealed=$work/tls.needles
[ "$(found "$sealed" token)" = 0 ] || fail "the TLS capture holds the token"
for key in "${key_names[@]}"; do
  [ "$(found "$sealed" "key:$key")" = 0 ] || fail "the TLS capture holds key text '$key'"
done
[ "$(found "$sealed" weights)" = 0 ] ||
  fail "the TLS capture holds $(found "$sealed" weights) runs of the initial weights"
# It saw the job: the store's connections and the data plane's, and at least the bytes of the
# 8 steps' gradients (each step allreduces all of them across the link).
[ "$(connections "$sealed")" -ge 2 ] ||
  fail "the TLS capture has $(connections "$sealed") connections, expected at least 2"
gradients=$((8 * $(stat -c %s "$work/weights.f32")))
[ "$(payload "$sealed")" -ge "$gradients" ] ||
  fail "the TLS capture holds $(payload "$sealed") payload bytes, less than 8 steps' gradients"
echo "traffic_capture: passed"
