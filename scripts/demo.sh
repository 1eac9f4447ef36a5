#!/usr/bin/env bash
# Sets up, builds and runs the main job: why hierarchical averaging exists, in about a minute.
#
# With root (network namespaces and tc): two emulated nodes of 2 workers each, joined by a
# 100 Mbit/s link (scripts/emulated_cluster.sh), train the MLP on 30,000 Fashion-MNIST images
# twice from the same start:
#   1. DDP: every step allreduces the gradients of all 4 workers across the slow link;
#   2. hierarchical averaging: 20 warm-up steps of DDP, then local SGD, the 2 workers of a node
#      average their models every step over shared memory and all 4 every 16 steps across the
#      link (--hierarchy 1:2,16:4).
# Both write their metrics (--metrics-out, JSON lines) under build/demo/; scripts/plot_metrics.py
# draws test accuracy against wall time for both into build/demo/ddp_vs_hierarchical.png.
#
# Without root: the hierarchical job runs on 4 local workers (no slow link to hide, so no
# comparison), and the demo prints the command that runs the comparison.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
cd "$root"

out=$root/build/demo
mkdir -p "$out"
train=(./build/apps/train_mlp/train_mlp --train-subset 30000 --eval-every 20 --max-eval 2000)
hierarchical=(--mode hierarchical --subgroup-size 1 --hierarchy 1:2,16:4 --warmup-steps 20)

# Runs one job on the emulated cluster; returns 77 when namespaces cannot be made here.
emulated() {
  local name=$1
  shift
  scripts/emulated_cluster.sh --rate 100mbit --nproc-per-node 2 --timeout 300 \
    --stats "$out/$name.link" -- "${train[@]}" --metrics-out "$out/$name.jsonl" "$@"
}

# Prints the link's bytes from a --stats file as "N MB".
link_mb() {
  awk -F= '/^bytes_/ { sum += $2 } END { printf "%.0f MB", sum / 1e6 }' "$1"
}

echo "== 1/2: DDP on 2 emulated nodes x 2 workers, 100 Mbit/s between the nodes =="
set +e
emulated ddp_2_nodes --mode ddp
code=$?
set -e
if [ "$code" -eq 77 ]; then
  echo
  echo "== no network namespaces here (needs root): the hierarchical job on 4 local workers =="
  ./build/apps/hsgd-run/hsgd-run --nproc-per-node 4 -- "${train[@]}" "${hierarchical[@]}" \
    --metrics-out "$out/hierarchical_4_workers.jsonl"
  echo
  echo "== done =="
  echo "metrics: $out/hierarchical_4_workers.jsonl"
  echo "The comparison with DDP across a 100 Mbit/s link needs root; run: sudo scripts/demo.sh"
  exit 0
fi
[ "$code" -eq 0 ] || exit "$code"

echo
echo "== 2/2: hierarchical averaging {1:2, 16:4} on the same emulated nodes =="
emulated hierarchical_2_nodes "${hierarchical[@]}"

echo
plot=$out/ddp_vs_hierarchical.png
if /usr/bin/python3 scripts/plot_metrics.py "$out/ddp_2_nodes.jsonl" \
    "$out/hierarchical_2_nodes.jsonl" -o "$plot" \
    --title "train_mlp, 2 nodes x 2 workers, 100 Mbit/s between the nodes"; then
  plot_note="plot:    $plot"
else
  plot_note="plot:    not drawn (needs /usr/bin/python3 with matplotlib: apt-get install python3-matplotlib)"
fi
echo "== done =="
echo "bytes across the link: DDP $(link_mb "$out/ddp_2_nodes.link"), hierarchical $(link_mb "$out/hierarchical_2_nodes.link")"
echo "metrics: $out/ddp_2_nodes.jsonl"
echo "         $out/hierarchical_2_nodes.jsonl"
echo "$plot_note"
