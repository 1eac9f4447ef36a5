#!/usr/bin/env bash
# Usage: check.sh HSGD_BUILD_DIR WORK_DIR. Configures, builds and runs tests/package/main.cpp
# against the exported build tree; fails if any step fails or the app prints the wrong answer.
set -euo pipefail
build_dir=$1
work_dir=$2
src_dir=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work_dir"
# HSGD_PACKAGE_CXX_FLAGS / HSGD_PACKAGE_LINKER_FLAGS: the flags hsgd was built with (the test
# passes them), e.g. the sanitizers of scripts/sanitize.sh.
cmake -S "$src_dir" -B "$work_dir" -Dhsgd_DIR="$build_dir" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS="${HSGD_PACKAGE_CXX_FLAGS:-}" \
  -DCMAKE_EXE_LINKER_FLAGS="${HSGD_PACKAGE_LINKER_FLAGS:-}" >/dev/null
cmake --build "$work_dir" -j2 >/dev/null
out=$("$work_dir/package_app")
echo "package_app printed: $out"
[ "$out" = "hsgd package ok" ]
