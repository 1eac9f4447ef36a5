// CollectiveWatchdog (comm/process_group/detail/collective_watchdog.h) on its own: one watchdog
// per simulated rank over one HashStore, driven by begin/end calls instead of collectives, so
// that each test sets exactly which rank is in which collective and for how long.

#include "comm/process_group/detail/collective_watchdog.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/store/hash_store.h"

namespace hsgd::detail {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr auto kThreshold = std::chrono::milliseconds(50);
constexpr auto kTestWait = std::chrono::seconds(20);  // bounds every wait of these tests
// Long enough for a watchdog to publish, see a peer at another seq for a threshold, settle and
// store a report (about 4 thresholds), with a wide margin for a loaded machine.
constexpr auto kManyThresholds = 40 * kThreshold;

CollectiveFingerprint grads(uint64_t seq) {
  return {.kind = "allreduce",
          .dtype = "float",
          .count = 272,
          .args = "sum",
          .label = "DDP bucket 0",
          .seq = seq};
}

CollectiveFingerprint preemption_flag(uint64_t seq) {
  return {.kind = "allreduce",
          .dtype = "double",
          .count = 1,
          .args = "max",
          .label = "preemption flag",
          .seq = seq};
}

// A group of `size` watchdogs over one store, each recording the reports it was given.
class Group {
 public:
  explicit Group(int size) : store_(std::make_shared<comm::HashStore>()) {
    for (int r = 0; r < size; ++r) {
      watchdogs_.push_back(
          std::make_unique<CollectiveWatchdog>(CollectiveWatchdog::Config{.store = store_,
                                                                          .key_prefix = "g/",
                                                                          .rank = r,
                                                                          .size = size,
                                                                          .threshold = kThreshold,
                                                                          .group_name = "world"},
                                               [this](const MismatchReport& report) {
                                                 std::lock_guard<std::mutex> lock(mu_);
                                                 reports_.push_back(report.message);
                                               }));
    }
  }

  CollectiveWatchdog& rank(int r) { return *watchdogs_[static_cast<size_t>(r)]; }
  comm::HashStore& store() { return *store_; }

  // Every rank runs collectives 0 .. count - 1 (gradients), each completing at once.
  void complete_everywhere(uint64_t count) {
    for (uint64_t seq = 0; seq < count; ++seq) {
      for (auto& watchdog : watchdogs_) {
        watchdog->begin(grads(seq));
        watchdog->end();
      }
    }
  }

  // Waits until every rank has published the collective it waits in (each has waited past the
  // threshold and its watchdog has read the others); false after kTestWait.
  bool all_published() {
    const auto deadline = Clock::now() + kTestWait;
    while (Clock::now() < deadline) {
      bool all = true;
      for (size_t r = 0; r < watchdogs_.size(); ++r) {
        all = all && store_->check({"g/waiting/" + std::to_string(r)});
      }
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  // Waits until every rank was given a report; false after kTestWait.
  bool all_reported() {
    const auto deadline = Clock::now() + kTestWait;
    while (Clock::now() < deadline) {
      bool all = true;
      for (auto& watchdog : watchdogs_) all = all && watchdog->found() != nullptr;
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  std::vector<std::string> reports() {
    std::lock_guard<std::mutex> lock(mu_);
    return reports_;
  }

 private:
  std::shared_ptr<comm::HashStore> store_;
  std::mutex mu_;
  std::vector<std::string> reports_;  // guarded by mu_
  std::vector<std::unique_ptr<CollectiveWatchdog>> watchdogs_;
};

// After a lost link, TCP held the last messages of allreduce #5 for seconds: rank 2 received
// everything, completed it and waits in #6, while ranks 0, 1, 3 are still in #5. They are
// stragglers in the collective rank 2 completed, not in another one: no rank reports a mismatch,
// and all complete once the messages arrive.
TEST(CollectiveWatchdogTest, StragglerInACollectiveAnotherRankCompleted_IsNotAMismatch) {
  Group group(4);
  group.complete_everywhere(5);
  for (int r : {0, 1, 3}) group.rank(r).begin(grads(5));
  group.rank(2).begin(grads(5));
  group.rank(2).end();
  group.rank(2).begin(preemption_flag(6));
  ASSERT_TRUE(group.all_published());
  std::this_thread::sleep_for(kManyThresholds);
  for (int r : {0, 1, 3}) {
    group.rank(r).end();
    group.rank(r).begin(preemption_flag(6));
  }
  for (int r = 0; r < 4; ++r) group.rank(r).end();
  EXPECT_THAT(group.reports(), ElementsAre());
  EXPECT_FALSE(group.store().check({"g/mismatch"}))
      << comm::to_string(group.store().get("g/mismatch", kTestWait));
}

// Rank 1 waits at #5 in another collective than the one rank 0 ran as #5: rank 0 (ahead)
// finds it in its history and stores the report; rank 1 (behind) adopts it.
TEST(CollectiveWatchdogTest, LowerSeqWithAnotherShape_IsAMismatch) {
  Group group(2);
  group.complete_everywhere(5);
  group.rank(0).begin(grads(5));
  group.rank(0).end();
  group.rank(0).begin(preemption_flag(6));
  group.rank(1).begin(preemption_flag(5));
  ASSERT_TRUE(group.all_reported());
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(group.rank(r).found()->message,
                HasSubstr("allreduce (1 x double, max) #6 'preemption flag' was called on rank 0 "
                          "only; rank 1 is in allreduce (1 x double, max) #5 'preemption flag'"))
        << "rank " << r;
    EXPECT_THAT(group.rank(r).found()->same_ranks, ElementsAre(r));
  }
  group.rank(0).end();
  group.rank(1).end();
}

// A member behind by more collectives than this rank remembers cannot be told from one in
// another collective: a wait there past the threshold is a mismatch.
TEST(CollectiveWatchdogTest, LowerSeqOlderThanTheHistory_IsAMismatch) {
  Group group(2);
  group.complete_everywhere(5);
  group.rank(1).begin(grads(5));
  for (uint64_t seq = 5; seq < 5 + CollectiveWatchdog::kHistory; ++seq) {
    group.rank(0).begin(grads(seq));
    group.rank(0).end();
  }
  group.rank(0).begin(grads(5 + CollectiveWatchdog::kHistory));
  ASSERT_TRUE(group.all_reported());
  EXPECT_THAT(group.rank(1).found()->message,
              HasSubstr("rank 1 is in allreduce (272 x float, sum) #5 'DDP bucket 0'"));
  group.rank(0).end();
  group.rank(1).end();
}

}  // namespace
}  // namespace hsgd::detail
