// Storage and its block cache (block_cache.h): a training loop that frees and allocates the
// same large blocks every step must not fault their pages in again every time (counts the
// process's minor page faults, getrusage, not time), reused blocks must never overlap live ones,
// and the cache stays within its limit. Tests that read memory_stats() compare differences:
// other tests in this process may hold tensors.

#include "framework/tensor/storage.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "framework/tensor/block_cache.h"
#include "framework/tensor/generator.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"
#include "framework/tensor/tensor.h"

namespace hsgd {
namespace {

long minor_faults() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

constexpr int64_t kFloats = int64_t{4} << 20;  // 16 MiB: above glibc's default mmap threshold
constexpr int kSteps = 20;

#define SKIP_WITHOUT_CACHE()                                                                \
  if (!block_cache_enabled()) {                                                             \
    GTEST_SKIP() << "the block cache is off (AddressSanitizer or HSGD_MALLOC_DEFAULTS=1): " \
                    "blocks come from operator new";                                        \
  }

TEST(StorageTest, RecycledLargeBlocksAreNotFaultedInAgain) {
  SKIP_WITHOUT_CACHE();
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
  // in all, measured); with the glibc settings this replaced about 1,000 pages a step (20,000
  // measured), with the cache none. The bound is one block a step.
  EXPECT_LT(faults, kSteps * 4096)
      << faults << " minor page faults over " << kSteps << " steps of two 16 MiB blocks";
}

// Fills a block with a pattern of its own id, so that an overlap with any other block shows.
void fill(Storage& s, float id) {
  for (int64_t i = 0; i < s.numel(); i += 97) s.data()[i] = id + static_cast<float>(i % 7);
}
int64_t mismatches(const Storage& s, float id) {
  int64_t bad = 0;
  for (int64_t i = 0; i < s.numel(); i += 97) bad += s.data()[i] != id + static_cast<float>(i % 7);
  return bad;
}

TEST(BlockCacheTest, FreedBlockIsReusedForTheSameSizeOnly) {
  SKIP_WITHOUT_CACHE();
  constexpr int64_t kSize = 300000;  // 1.2 MB
  const float* first = nullptr;
  {
    Storage a(kSize);
    first = a.data();
  }
  const MemoryStats before = memory_stats();
  Storage again(kSize);
  EXPECT_EQ(again.data(), first) << "a freed block of the same size is handed out again";
  EXPECT_EQ(memory_stats().maps, before.maps);
  Storage other(kSize + 4096);  // another page count: a new block
  EXPECT_NE(other.data(), first);
  EXPECT_EQ(memory_stats().maps, before.maps + 1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(other.data()) % 64, 0u);
}

TEST(BlockCacheTest, SmallBlocksBypassTheCacheAndAreAligned) {
  const MemoryStats before = memory_stats();
  std::vector<std::unique_ptr<Storage>> small;
  for (int64_t n : {1, 3, 17, 1000, 65535}) {
    small.push_back(std::make_unique<Storage>(n));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(small.back()->data()) % 64, 0u) << "numel " << n;
  }
  const MemoryStats during = memory_stats();
  EXPECT_EQ(during.maps, before.maps);
  EXPECT_EQ(during.allocated_bytes - before.allocated_bytes,
            int64_t{4} * (1 + 3 + 17 + 1000 + 65535));
  small.clear();
  EXPECT_EQ(memory_stats().allocated_bytes, before.allocated_bytes);
}

// A random sequence of allocations and frees of a few sizes: live blocks keep their contents
// (no block is handed out twice), the counters add up, and what the cache maps stays within
// max(64 MiB, 1.5 x the highest live total) plus the block being allocated.
TEST(BlockCacheTest, RandomWorkloadKeepsContentsAndStaysWithinTheLimit) {
  SKIP_WITHOUT_CACHE();
  empty_cache();
  const MemoryStats start = memory_stats();
  std::mt19937 rng(7);
  const std::vector<int64_t> sizes = {70000, 262144, 1000000, 2500000, 6000000};  // floats
  std::map<int, std::unique_ptr<Storage>> live;
  int64_t peak_live = 0;
  for (int op = 0; op < 600; ++op) {
    if (live.size() < 12 && (live.empty() || rng() % 3 != 0)) {
      const int64_t n = sizes[rng() % sizes.size()];
      auto s = std::make_unique<Storage>(n);
      fill(*s, static_cast<float>(op));
      live.emplace(op, std::move(s));
    } else {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      ASSERT_EQ(mismatches(*it->second, static_cast<float>(it->first)), 0)
          << "block of op " << it->first << " was overwritten (handed out twice?)";
      live.erase(it);
    }
    int64_t live_bytes = 0;
    for (const auto& [id, s] : live) live_bytes += s->numel() * 4;
    peak_live = std::max(peak_live, live_bytes);
    const MemoryStats now = memory_stats();
    ASSERT_GE(now.allocated_bytes - start.allocated_bytes, live_bytes) << "op " << op;
    // Rounded up to pages: at most a page more per block.
    ASSERT_LE(now.allocated_bytes - start.allocated_bytes,
              live_bytes + static_cast<int64_t>(live.size()) * 4096)
        << "op " << op;
    const int64_t limit =
        std::max<int64_t>(int64_t{64} << 20, (peak_live + start.allocated_bytes) * 3 / 2) +
        (int64_t{24} << 20);
    ASSERT_LE(now.reserved_bytes, limit) << "op " << op << ": live " << live_bytes;
  }
  const MemoryStats end = memory_stats();
  EXPECT_GT(end.maps - start.maps, 0);
  EXPECT_LT(end.maps - start.maps, 300) << "most of 400 allocations reuse idle blocks";
  live.clear();
  empty_cache();
  EXPECT_EQ(memory_stats().cached_blocks, 0);
  EXPECT_EQ(memory_stats().reserved_bytes, memory_stats().allocated_bytes);
}

TEST(BlockCacheTest, ConcurrentThreadsNeverShareABlock) {
  std::vector<std::thread> threads;
  std::vector<int64_t> bad(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &bad] {
      std::mt19937 rng(t);
      std::vector<std::pair<float, std::unique_ptr<Storage>>> mine;
      for (int i = 0; i < 300; ++i) {
        const float id = static_cast<float>(t * 1000 + i);
        mine.emplace_back(id, std::make_unique<Storage>(70000 + 30000 * (rng() % 4)));
        fill(*mine.back().second, id);
        if (mine.size() > 3) {
          const size_t k = rng() % mine.size();
          bad[t] += mismatches(*mine[k].second, mine[k].first);
          mine.erase(mine.begin() + static_cast<long>(k));
        }
      }
      for (auto& [id, s] : mine) bad[t] += mismatches(*s, id);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
}

// fork() while another thread allocates: the child can still allocate (the cache's lock is not
// left held in the child).
TEST(BlockCacheTest, ForkedChildAllocatesWhileAnotherThreadWasAllocating) {
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    while (!stop.load()) Storage s(100000);
  });
  int failures = 0;
  for (int round = 0; round < 20; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::alarm(10);  // a deadlock ends the child with SIGALRM instead of hanging the test
      {
        Storage s(100000);
        s.data()[0] = 1.0f;
      }
      ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  stop = true;
  busy.join();
  EXPECT_EQ(failures, 0) << "children that did not exit 0 (SIGALRM: deadlock in the cache)";
}

// The point of the cache: steps of a small conv net map nothing after the first, and what the
// cache holds stays close to the live peak.
TEST(BlockCacheTest, RepeatedTrainingStepsMapNothingNew) {
  SKIP_WITHOUT_CACHE();
  Generator gen(3);
  Tensor w1 = randn({16, 3, 3, 3}, gen).set_requires_grad(true);
  Tensor w2 = randn({16, 16, 3, 3}, gen).set_requires_grad(true);
  const Tensor x = randn({32, 3, 32, 32}, gen);  // activations of 2 MiB
  auto step = [&] {
    Tensor h = relu(conv2d(x, w1, Tensor(), {1, 1}, {1, 1}));
    Tensor y = relu(conv2d(h, w2, Tensor(), {1, 1}, {1, 1}));
    sum(mul(y, y)).backward();
    w1.set_grad(Tensor());
    w2.set_grad(Tensor());
  };
  step();
  empty_cache();
  reset_peak_memory_stats();
  step();
  const MemoryStats after_second = memory_stats();
  for (int i = 0; i < 3; ++i) step();
  const MemoryStats after_fifth = memory_stats();
  EXPECT_EQ(after_fifth.maps, after_second.maps) << "steps 3-5 mapped new blocks";
  EXPECT_LE(after_fifth.peak_reserved_bytes, after_fifth.peak_allocated_bytes * 3 / 2)
      << "reserved " << after_fifth.peak_reserved_bytes << " vs allocated "
      << after_fifth.peak_allocated_bytes;
}

}  // namespace
}  // namespace hsgd
