#include "framework/data/batch_prefetcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/error.h"
#include "framework/data/synthetic_dataset.h"
#include "tests/support/error_message.h"

namespace hsgd::data {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Batch i holds the single value i.
Batch numbered(int64_t i) { return Batch{from_vector({static_cast<float>(i)}, {1, 1}), {i}}; }

// Waits up to 10 s until count == n, then 50 ms more; returns count then.
int64_t settle_at(const std::atomic<int64_t>& count, int64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + seconds(10);
  while (count.load() < n && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(2));
  }
  std::this_thread::sleep_for(milliseconds(50));
  return count.load();
}

TEST(BatchPrefetcherTest, HandsOutEveryBatchInOrder_FromStart) {
  BatchPrefetcher prefetcher(numbered, /*start=*/3, /*end=*/20, /*depth=*/2, seconds(30));
  for (int64_t i = 3; i < 20; ++i) {
    ASSERT_EQ(prefetcher.next_index(), i);
    const Batch b = prefetcher.next();
    EXPECT_EQ(b.inputs.item(), static_cast<float>(i)) << "batch " << i;
    EXPECT_EQ(b.targets, std::vector<int64_t>{i});
  }
  EXPECT_THROW(prefetcher.next(), InvalidArgument);  // past the end
}

TEST(BatchPrefetcherTest, LoadsAtMostDepthAhead_OfTheConsumer) {
  std::atomic<int64_t> loaded{0};
  BatchPrefetcher prefetcher(
      [&](int64_t i) {
        loaded.fetch_add(1);
        return numbered(i);
      },
      0, 100, /*depth=*/3, seconds(30));
  EXPECT_EQ(settle_at(loaded, 3), 3) << "before the consumer took any";
  for (int64_t taken = 1; taken <= 5; ++taken) {
    prefetcher.next();
    EXPECT_EQ(settle_at(loaded, taken + 3), taken + 3) << "after taking " << taken;
  }
}

TEST(BatchPrefetcherTest, WorkerException_IsRethrownAtItsBatch_WithItsMessage) {
  BatchPrefetcher prefetcher(
      [](int64_t i) {
        if (i == 4) throw std::runtime_error("disk on fire at batch 4");
        return numbered(i);
      },
      0, 10, 2, seconds(30));
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(prefetcher.next().inputs.item(), static_cast<float>(i));
  for (int repeat = 0; repeat < 2; ++repeat) {  // and again on a later call
    try {
      prefetcher.next();
      FAIL() << "batch 4 did not throw";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "disk on fire at batch 4");
    }
  }
  EXPECT_EQ(prefetcher.next_index(), 4);
}

TEST(BatchPrefetcherTest, SlowBatch_ThrowsTimeoutNamingIt_AndDestructionWaitsForTheLoad) {
  std::atomic<bool> release{false};
  std::atomic<int64_t> finished{0};
  {
    BatchPrefetcher prefetcher(
        [&](int64_t i) {
          if (i == 1) {
            while (!release.load()) std::this_thread::sleep_for(milliseconds(1));
          }
          finished.fetch_add(1);
          return numbered(i);
        },
        0, 10, 2, milliseconds(50));
    EXPECT_EQ(prefetcher.next().inputs.item(), 0.0f);
    const std::string message = hsgd::testing::error_message<Timeout>([&] { prefetcher.next(); });
    EXPECT_NE(message.find("batch 1 was not loaded after 50 ms"), std::string::npos) << message;
    EXPECT_THROW(prefetcher.next(), Timeout);
    release = true;  // the destructor joins once batch 1 is loaded
  }
  const int64_t after = finished.load();
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(finished.load(), after) << "the worker kept loading after the destructor";
}

TEST(BatchPrefetcherTest, DestroyedWhileTheWorkerWaitsForRoom_JoinsAndStopsLoading) {
  std::atomic<int64_t> loaded{0};
  {
    BatchPrefetcher prefetcher(
        [&](int64_t i) {
          loaded.fetch_add(1);
          return numbered(i);
        },
        0, 1000, 2, seconds(30));
    prefetcher.next();
    EXPECT_EQ(settle_at(loaded, 3), 3);  // the worker now waits for room
  }
  EXPECT_EQ(loaded.load(), 3);
}

TEST(BatchPrefetcherTest, InvalidArguments_AreRejectedWithTheValue) {
  const std::string depth =
      hsgd::testing::error_message([] { BatchPrefetcher p(numbered, 0, 4, 0, seconds(1)); });
  EXPECT_NE(depth.find("depth 0 must be at least 1"), std::string::npos) << depth;
  EXPECT_THROW(BatchPrefetcher(numbered, 5, 4, 1, seconds(1)), InvalidArgument);
  EXPECT_THROW(BatchPrefetcher(numbered, 0, 4, 1, milliseconds(0)), InvalidArgument);
  EXPECT_THROW(BatchPrefetcher(nullptr, 0, 4, 1, seconds(1)), InvalidArgument);
}

}  // namespace
}  // namespace hsgd::data
