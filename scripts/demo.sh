#!/usr/bin/env bash
# Sets up, builds and runs the main job: an MLP trained on Fashion-MNIST.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
cd "$root"
./build/apps/train_mlp/train_mlp --epochs 1 "$@"
