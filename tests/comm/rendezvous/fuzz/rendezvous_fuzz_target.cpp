// libFuzzer entry point of the rendezvous server's frame decoder and dispatcher. Built only with
// -DHSGD_BUILD_FUZZERS=ON and clang (scripts/fuzz.sh); the normal suite replays the committed
// corpus through the same run_input() (rendezvous_fuzz_replay_test.cpp).

#include <cstddef>
#include <cstdint>

#include "tests/comm/rendezvous/fuzz/rendezvous_fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  hsgd::comm::fuzz::run_input(data, size);
  return 0;
}
