#!/usr/bin/env bash
# Fuzzes the rendezvous server's frame decoder and request dispatcher with libFuzzer for a set
# time: scripts/fuzz.sh [SECONDS=60] [extra libFuzzer flags...]
#
# Builds tests/comm/rendezvous/fuzz/rendezvous_fuzz_target.cpp with Debian's clang 14
# (packages clang-14 and libclang-rt-14-dev) and ASan + UBSan in build-fuzz/, separate from the
# normal build. The fuzzer starts from a copy of the committed seed corpus
# (tests/comm/rendezvous/fuzz/corpus) in build-fuzz/corpus, so the committed files change only
# by hand: copy an input worth keeping there (and check the replay test,
# rendezvous_fuzz_replay_test, still passes). A crash leaves build-fuzz/crash-* and exit code 1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
shift || true
cxx=${HSGD_FUZZ_CXX:-clang++-14}
cc=${HSGD_FUZZ_CC:-clang-14}
if ! command -v "$cxx" >/dev/null; then
  echo "fuzz.sh: $cxx not found; install clang-14 and libclang-rt-14-dev" >&2
  exit 2
fi
build="$root/build-fuzz"
sanitizers="address,undefined"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,$sanitizers -fno-sanitize-recover=undefined" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=$sanitizers" \
  -DHSGD_BUILD_TESTS=ON -DHSGD_BUILD_FUZZERS=ON \
  ${CMAKE_CXX_COMPILER_LAUNCHER:+-DCMAKE_CXX_COMPILER_LAUNCHER=$CMAKE_CXX_COMPILER_LAUNCHER} \
  >/dev/null
cmake --build "$build" -j "${HSGD_FUZZ_BUILD_JOBS:-2}" --target rendezvous_fuzz
mkdir -p "$build/corpus"
cp -n "$root"/tests/comm/rendezvous/fuzz/corpus/* "$build/corpus/"
cd "$build"
# -max_len: a few frames of up to 64 KiB are enough to reach every limit of the fuzz server.
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
  ./tests/comm/rendezvous/rendezvous_fuzz corpus -max_total_time="$seconds" -max_len=70000 \
  -print_final_stats=1 "$@"
