#!/usr/bin/env bash
# Sets up, builds and runs the main job:
#  1. the MLP trained on Fashion-MNIST for one epoch in one process (prints test accuracy);
#  2. the same model on 4 workers launched by hsgd-run (embedded rendezvous server), with local
#     SGD inside each worker and hierarchical model averaging: pairs of workers average every 2
#     steps, all 4 every 4 steps (after 20 warm-up steps of plain DDP). Prints the accuracy of
#     the averaged model and the averaging calls, bytes and seconds per level.
# Both runs write their metrics (--metrics-out, JSON lines) under build/demo/, drawn into one
# plot by scripts/plot_metrics.py; the demo ends by printing where they are.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
cd "$root"

out=$root/build/demo
mkdir -p "$out"

echo "== 1/2: one process, one epoch =="
./build/apps/train_mlp/train_mlp --epochs 1 --eval-every 200 \
  --metrics-out "$out/one_process.jsonl" "$@"

echo
echo "== 2/2: hsgd-run, 4 workers, hierarchical model averaging {2:2, 4:4} =="
./build/apps/hsgd-run/hsgd-run --nproc-per-node 4 -- \
  ./build/apps/train_mlp/train_mlp --epochs 2 --mode hierarchical --hierarchy 2:2,4:4 \
  --subgroup-size 1 --warmup-steps 20 --eval-every 50 --metrics-out "$out/hierarchical_4_workers.jsonl"

echo
plot=$out/metrics.png
if /usr/bin/python3 "$root/scripts/plot_metrics.py" "$out/one_process.jsonl" \
    "$out/hierarchical_4_workers.jsonl" -o "$plot" --title "train_mlp on Fashion-MNIST"; then
  plot_note="plot:    $plot"
else
  plot_note="plot:    not drawn (needs /usr/bin/python3 with matplotlib: apt-get install python3-matplotlib)"
fi
echo "== done =="
echo "metrics: $out/one_process.jsonl"
echo "         $out/hierarchical_4_workers.jsonl"
echo "$plot_note"
