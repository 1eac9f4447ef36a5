// CollectiveQueue (comm/process_group/detail/collective_queue.h) on its own, in one process and
// without Gloo: tasks queued for the worker (enqueue) and run on the calling thread when the
// queue is idle (run_or_enqueue) keep one order, and a task run on the calling thread follows
// the same failure rules and is seen by the watchdog like one run on the worker.

#include "comm/process_group/detail/collective_queue.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "comm/error.h"
#include "comm/store/hash_store.h"
#include "tests/support/error_message.h"

namespace hsgd::detail {
namespace {

using hsgd::testing::error_message;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr auto kGroupTimeout = std::chrono::seconds(30);
constexpr auto kTestWait = std::chrono::seconds(10);  // bounds every wait of these tests

// What the group does: the failure of fp becomes a CommError naming it.
std::exception_ptr name_failure(const CollectiveFingerprint& fp, const std::exception& e) {
  return std::make_exception_ptr(CommError(fp.describe() + " failed: " + e.what()));
}

// Which tasks ran, in order, and on which thread.
struct Log {
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  void add(int id) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(id);
    threads.push_back(std::this_thread::get_id());
  }
};

CollectiveFingerprint allreduce_fp(uint64_t count) {
  return {.kind = "allreduce", .dtype = "float", .count = count, .args = "sum"};
}

// The Work::wait helper the group passes: runs queued tasks on the waiting thread.
comm::Work::Helper helper_of(CollectiveQueue& queue) {
  return [&queue](const comm::Work& w, comm::Duration timeout) { queue.help(w, timeout); };
}

TEST(CollectiveQueueTest, RunOrEnqueue_RunsOnTheCallingThreadWhenIdle) {
  CollectiveQueue queue("world", kGroupTimeout, name_failure);
  Log log;
  uint32_t tag = 0;
  auto work = queue.run_or_enqueue(
      allreduce_fp(7),
      [&](uint32_t t) {
        tag = t;
        log.add(0);
      },
      helper_of(queue));
  ASSERT_TRUE(work->is_completed()) << "an idle queue ran the task on the worker";
  EXPECT_TRUE(work->is_success());
  ASSERT_EQ(log.threads.size(), 1u);
  EXPECT_EQ(log.threads[0], std::this_thread::get_id());
  EXPECT_EQ(tag, gloo_tag(0, allreduce_fp(7).shape_hash()));
  EXPECT_EQ(work->description(), "allreduce (7 x float, sum) #0 of group 'world'");
  EXPECT_EQ(queue.next_seq(), 1u);
}

TEST(CollectiveQueueTest, RunOrEnqueue_QueuesBehindARunningTask) {
  CollectiveQueue queue("world", kGroupTimeout, name_failure);
  Log log;
  std::promise<void> started, release;
  auto released = release.get_future().share();
  auto first = queue.enqueue(
      allreduce_fp(1),
      [&](uint32_t) {
        started.set_value();
        ASSERT_EQ(released.wait_for(kTestWait), std::future_status::ready);
        log.add(0);
      },
      helper_of(queue));
  ASSERT_EQ(started.get_future().wait_for(kTestWait), std::future_status::ready);
  // The worker runs task 0: this one must wait behind it, not run beside it.
  auto second = queue.run_or_enqueue(
      allreduce_fp(1), [&](uint32_t) { log.add(1); }, helper_of(queue));
  EXPECT_FALSE(second->is_completed());
  auto third = queue.enqueue(
      allreduce_fp(1), [&](uint32_t) { log.add(2); }, helper_of(queue));
  release.set_value();
  third->wait(kTestWait);
  EXPECT_TRUE(first->is_success() && second->is_success() && third->is_success());
  EXPECT_THAT(log.order, ::testing::ElementsAre(0, 1, 2));
}

// Async calls (never waited for one by one) mixed with direct ones from two threads: every task
// runs once, one at a time, in the order of its sequence number.
TEST(CollectiveQueueTest, InterleavedAsyncAndDirect_RunInSequenceOrder) {
  CollectiveQueue queue("world", kGroupTimeout, name_failure);
  std::mutex mu;
  std::vector<uint32_t> ran;  // tags, whose low bits are the sequence numbers
  int running = 0, overlaps = 0;
  auto task = [&](uint32_t tag) {
    {
      std::lock_guard<std::mutex> lock(mu);
      overlaps += running++ > 0;
    }
    std::this_thread::yield();
    std::lock_guard<std::mutex> lock(mu);
    --running;
    ran.push_back(tag & 0xFFFFFu);
  };
  auto issue = [&](int n, std::vector<std::shared_ptr<comm::Work>>& works) {
    for (int i = 0; i < n; ++i) {
      works.push_back(i % 3 == 0 ? queue.enqueue(allreduce_fp(1), task, helper_of(queue))
                                 : queue.run_or_enqueue(allreduce_fp(1), task, helper_of(queue)));
    }
  };
  std::vector<std::shared_ptr<comm::Work>> mine, theirs;
  std::thread other([&] { issue(200, theirs); });
  issue(200, mine);
  other.join();
  for (auto* works : {&mine, &theirs}) {
    for (auto& w : *works) w->wait(kTestWait);
  }
  ASSERT_EQ(ran.size(), 400u);
  EXPECT_EQ(overlaps, 0);
  for (uint32_t i = 0; i < ran.size(); ++i) {
    ASSERT_EQ(ran[i], i) << "index " << i << ": expected task #" << i << ", got #" << ran[i];
  }
}

TEST(CollectiveQueueTest, DirectFailure_BreaksTheQueueAsOnTheWorker) {
  CollectiveQueue queue("world", kGroupTimeout, name_failure);
  auto failed = queue.run_or_enqueue(
      allreduce_fp(3), [](uint32_t) { throw std::runtime_error("connection reset"); },
      helper_of(queue));
  ASSERT_TRUE(failed->is_completed());
  EXPECT_THAT(error_message<CommError>([&] { failed->wait(kTestWait); }),
              HasSubstr("allreduce (3 x float, sum) #0 failed: connection reset"));
  EXPECT_TRUE(queue.broken());
  bool ran = false;
  for (auto run : {&CollectiveQueue::enqueue, &CollectiveQueue::run_or_enqueue}) {
    auto later = (queue.*run)(
        allreduce_fp(3), [&](uint32_t) { ran = true; }, helper_of(queue));
    EXPECT_THAT(error_message<CommError>([&] { later->wait(kTestWait); }),
                HasSubstr("of group 'world' was not run: the group is broken since allreduce "
                          "(3 x float, sum) #0 failed"));
  }
  EXPECT_FALSE(ran);
}

TEST(CollectiveQueueTest, DirectInvalidArgument_LeavesTheQueueIntact) {
  CollectiveQueue queue("world", kGroupTimeout, name_failure);
  auto refused = queue.run_or_enqueue(
      allreduce_fp(3), [](uint32_t) { HSGD_THROW(InvalidArgument, "bad root 9"); },
      helper_of(queue));
  EXPECT_THAT(error_message<InvalidArgument>([&] { refused->wait(kTestWait); }),
              HasSubstr("bad root 9"));
  EXPECT_FALSE(queue.broken());
  bool ran = false;
  queue
      .run_or_enqueue(
          allreduce_fp(3), [&](uint32_t) { ran = true; }, helper_of(queue))
      ->wait(kTestWait);
  EXPECT_TRUE(ran);
}

TEST(CollectiveQueueTest, RunOrEnqueue_AfterClose_FailsWithoutRunning) {
  CollectiveQueue queue("world", kGroupTimeout, name_failure);
  queue.close();
  bool ran = false;
  auto work = queue.run_or_enqueue(
      allreduce_fp(2), [&](uint32_t) { ran = true; }, helper_of(queue));
  EXPECT_THAT(error_message<CommError>([&] { work->wait(kTestWait); }),
              HasSubstr("allreduce (2 x float, sum) #0 of group 'world' was not run: the group "
                        "was shut down"));
  EXPECT_FALSE(ran);
  EXPECT_EQ(queue.next_seq(), 0u);
}

// A task run on the calling thread that waits past the mismatch threshold is published by the
// watchdog, as one on the worker is, and unpublished once it ended.
TEST(CollectiveQueueTest, DirectTask_IsSeenByTheWatchdog) {
  auto store = std::make_shared<comm::HashStore>();
  CollectiveWatchdog watchdog({.store = store,
                               .key_prefix = "g/",
                               .rank = 0,
                               .size = 2,
                               .threshold = std::chrono::milliseconds(40),
                               .group_name = "world"},
                              [](const MismatchReport&) {});
  CollectiveQueue queue("world", kGroupTimeout, name_failure, &watchdog);
  std::string published;
  auto work = queue.run_or_enqueue(
      allreduce_fp(5),
      [&](uint32_t) {
        const auto deadline = Clock::now() + kTestWait;
        while (!store->check({"g/waiting/0"}) && Clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        if (store->check({"g/waiting/0"})) {
          published = comm::to_string(store->get("g/waiting/0", kTestWait));
        }
      },
      helper_of(queue));
  ASSERT_TRUE(work->is_success());
  EXPECT_THAT(published, HasSubstr("|allreduce (5 x float, sum) #0"));
  const auto deadline = Clock::now() + kTestWait;
  while (store->check({"g/waiting/0"}) && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_FALSE(store->check({"g/waiting/0"})) << "the key outlived the collective";
}

}  // namespace
}  // namespace hsgd::detail
