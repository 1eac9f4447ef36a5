#!/usr/bin/env bash
# Builds hsgd with AddressSanitizer + UndefinedBehaviorSanitizer in build-sanitize/ (separate
# from build/) and runs the whole test suite there: scripts/sanitize.sh [ctest args...]
#
# Slow (the whole tree compiles with instrumentation, and tests run 2-5x slower): on a shared
# machine keep HSGD_SANITIZE_JOBS at 2 (the default) and run nothing else meanwhile.
# What adapts to it: the package test passes these flags to its own separate build (an
# instrumented library needs an instrumented link); StorageTest's page-fault test skips, since
# ASan's allocator replaces glibc's malloc settings that it measures.
# Any sanitizer report fails the test that triggered it (UBSan halts on the first error, ASan on
# every error it finds, LeakSanitizer at exit). Exit code: ctest's.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-sanitize"
jobs=${HSGD_SANITIZE_JOBS:-2}
# Without vptr: UBSan's vptr check reads the vtable through a pipe(2) it opens for each check, so
# in a process out of descriptors it reports valid objects as "invalid vptr" (reproduced with a
# 10-line program; suppressions cannot match, the type name is unknown then), and
# hsgd_rendezvous_resources_test exhausts the server's descriptors on purpose. ASan still
# catches the use-after-free that the vptr check would see.
flags="-fsanitize=address,undefined -fno-sanitize=vptr -fno-omit-frame-pointer"
flags+=" -fno-sanitize-recover=undefined"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DHSGD_BUILD_TESTS=ON "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$jobs"
cd "$build"
# detect_leaks: also at exit of every test process. halt_on_error for UBSan: a report is a
# failure, not a warning in a log nobody reads.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:check_initialization_order=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --output-on-failure -j "$jobs" "$@"
