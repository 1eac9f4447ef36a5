#!/usr/bin/env bash
# Sets up, builds and runs every test: scripts/test.sh [ctest args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
cd "$root/build"
ctest --output-on-failure -j "${HSGD_TEST_JOBS:-2}" "$@"
