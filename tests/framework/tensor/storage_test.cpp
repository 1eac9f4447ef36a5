// Storage's malloc settings (storage.cpp): a training loop that frees and allocates the same
// large blocks every step must not fault their pages in again every time. Counts the process's
// minor page faults (getrusage), not time.

#include "framework/tensor/storage.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <memory>
#include <vector>

namespace hsgd {
namespace {

long minor_faults() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

constexpr int64_t kFloats = int64_t{4} << 20;  // 16 MiB: above glibc's default mmap threshold
constexpr int kSteps = 20;

// AddressSanitizer replaces malloc: Storage's glibc malloc settings do not apply under it, and
// its own allocator (quarantine, redzones) decides the page faults.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

TEST(StorageTest, RecycledLargeBlocksAreNotFaultedInAgain) {
  if (kAddressSanitizer) {
    GTEST_SKIP() << "under AddressSanitizer malloc is ASan's, not glibc's: Storage's malloc "
                    "settings, which this test measures, do not apply";
  }
  auto step = [] {
    // Two blocks alive at once, as an activation and its gradient.
    auto a = std::make_unique<Storage>(kFloats);
    auto b = std::make_unique<Storage>(kFloats);
    for (int64_t i = 0; i < kFloats; i += 1024) a->data()[i] = b->data()[i] = 1.0f;
  };
  step();  // first touch of the heap pages
  const long before = minor_faults();
  for (int i = 0; i < kSteps; ++i) step();
  const long faults = minor_faults() - before;
  // With glibc's defaults every step faults in both blocks again, 2 x 4096 pages (about 160,000
  // in all, measured); with Storage's settings about 1,000 pages a step (20,000 measured). The
  // bound is one block a step.
  EXPECT_LT(faults, kSteps * 4096)
      << faults << " minor page faults over " << kSteps << " steps of two 16 MiB blocks";
}

}  // namespace
}  // namespace hsgd
