// A rank that never arrives: the others get hsgd::Timeout naming it, within twice the timeout,
// instead of hanging. (The bound is the contract the test holds the library to; it is far above the
// nominal 1.5 x timeout so that a loaded machine does not make it flaky.)

#include <gtest/gtest.h>

#include <thread>

#include "comm/error.h"
#include "comm/process_group/process_group.h"
#include "comm/store/file_store.h"
#include "tests/support/multiprocess.h"
#include "tests/support/world.h"

namespace hsgd::comm {
namespace {

using Clock = std::chrono::steady_clock;
using hsgd::testing::run_ranks;
using hsgd::testing::unique_temp_dir;

constexpr auto kTimeout = std::chrono::milliseconds(3000);

TEST(CommTimeoutTest, MissingRankAtCollective_IsNamed) {
  const auto dir = unique_temp_dir("timeout");
  auto result = run_ranks(4, std::chrono::seconds(60), [&](int rank) {
    auto store = std::make_shared<FileStore>(dir);
    auto pg = init_process_group({.rank = rank,
                                  .world_size = 4,
                                  .store = store,
                                  .token = "test-token",
                                  .timeout = kTimeout});
    std::vector<float> x(1000, 1.0f);
    pg->allreduce(std::span<float>(x))->wait();  // everyone takes part in #0
    if (rank == 2) {
      // Stays alive (a dead peer would be a connection error, not a timeout) until the others
      // have checked their error.
      store->wait({"checked/0", "checked/1", "checked/3"}, std::chrono::seconds(30));
      return;
    }
    const auto start = Clock::now();
    try {
      pg->allreduce(std::span<float>(x))->wait();
      ADD_FAILURE() << "allreduce without rank 2 should time out";
    } catch (const Timeout& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("ranks [2]"), std::string::npos) << message;
      EXPECT_NE(message.find("allreduce"), std::string::npos) << message;
      EXPECT_NE(message.find("#1"), std::string::npos) << message;
      EXPECT_NE(message.find("'world'"), std::string::npos) << message;
    }
    EXPECT_LT(Clock::now() - start, 2 * kTimeout);
    // The group is broken now: later collectives fail at once, quoting the first failure.
    try {
      pg->barrier()->wait(std::chrono::seconds(5));
      ADD_FAILURE() << "a broken group should refuse work";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("broken"), std::string::npos) << e.what();
    }
    store->set("checked/" + std::to_string(rank), to_bytes("1"));
  });
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

TEST(CommTimeoutTest, MissingRankAtInit_IsNamed) {
  const auto dir = unique_temp_dir("timeout_init");
  auto result = run_ranks(3, std::chrono::seconds(30), [&](int rank) {
    if (rank == 1) return;  // never joins
    const auto start = Clock::now();
    try {
      init_process_group({.rank = rank,
                          .world_size = 3,
                          .store = std::make_shared<FileStore>(dir),
                          .token = "test-token",
                          .timeout = std::chrono::milliseconds(1000)});
      ADD_FAILURE() << "init without rank 1 should time out";
    } catch (const Timeout& e) {
      EXPECT_NE(std::string(e.what()).find("ranks [1]"), std::string::npos) << e.what();
    }
    EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(2000));
  });
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

TEST(CommTimeoutTest, WorkWaitTimeoutDoesNotCancelTheCollective) {
  auto result = hsgd::testing::run_world(2, [&](int rank, const auto& pg) {
    auto store = pg->store();
    std::vector<float> x{static_cast<float>(rank + 1)};
    if (rank == 1) store->wait({"rank0_waited"}, std::chrono::seconds(10));
    auto work = pg->allreduce(std::span<float>(x));
    if (rank == 0) {
      EXPECT_THROW(work->wait(std::chrono::milliseconds(50)), Timeout);
      EXPECT_FALSE(work->is_completed());
      store->set("rank0_waited", to_bytes("1"));
    }
    work->wait();
    EXPECT_EQ(x[0], 3.0f);
  });
  EXPECT_RANKS_OK(result);
}

}  // namespace
}  // namespace hsgd::comm
