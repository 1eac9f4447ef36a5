// A failure record in the store that does not parse (written by anything that can reach the
// job's keys) is a failure of that attempt: the agent stops the attempt's workers and restarts
// if --max-restarts allows, and never throws out of run(). In-process, over a
// HashStore, with shell workers.

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "comm/launcher/agent.h"
#include "comm/launcher/failure_record.h"
#include "comm/store/hash_store.h"
#include "tests/support/multiprocess.h"

namespace hsgd::comm::launcher {
namespace {

using std::chrono::milliseconds;
namespace fs = std::filesystem;

AgentOptions job(const std::string& script, int max_restarts) {
  return AgentOptions{.nproc_per_node = 2,
                      .run_id = "malformed",
                      .max_restarts = max_restarts,
                      .rdzv_timeout = std::chrono::seconds(20),
                      .grace_period = std::chrono::seconds(5),
                      .monitor_interval = milliseconds(20),
                      .program = {"/bin/sh", "-c", script}};
}

// The worker of attempt 0 sleeps (the garbage record is its attempt's failure); later attempts
// succeed at once. Each run leaves a file ran_<attempt>.<rank>.
std::string script(const fs::path& dir) {
  return "touch " + dir.string() +
         "/ran_$HSGD_RESTART_COUNT.$RANK; "
         "if [ $HSGD_RESTART_COUNT = 0 ]; then sleep 30; fi";
}

TEST(MalformedFailureRecordTest, GarbageRecord_FailsThatAttemptAndRestarts) {
  const auto dir = hsgd::testing::unique_temp_dir("malformed_restart");
  auto store = std::make_shared<HashStore>();
  store->set("hsgd-run/attempt/0/failed", to_bytes("garbage"));
  LaunchAgent agent(job(script(dir), 3), store);
  EXPECT_EQ(agent.run(), 0);
  EXPECT_TRUE(fs::exists(dir / "ran_1.0"));
  EXPECT_FALSE(fs::exists(dir / "ran_2.0")) << "attempt 1 succeeded; no attempt 2 expected";
}

TEST(MalformedFailureRecordTest, GarbageRecord_WithoutRestartsFailsTheJobNamingTheRecord) {
  const auto dir = hsgd::testing::unique_temp_dir("malformed_no_restart");
  auto store = std::make_shared<HashStore>();
  store->set("hsgd-run/attempt/0/failed", to_bytes("garbage\nnot a record"));
  LaunchAgent agent(job(script(dir), 0), store);
  EXPECT_EQ(agent.run(), 1);
  ASSERT_TRUE(agent.last_failure().has_value());
  EXPECT_TRUE(agent.last_failure()->restartable());
  EXPECT_NE(agent.last_failure()->message.find("malformed failure record"), std::string::npos)
      << agent.last_failure()->message;
  EXPECT_NE(agent.last_failure()->message.find("garbage"), std::string::npos)
      << agent.last_failure()->message;
}

// A worker fails while garbage occupies the key: compare_set loses to it, and the agent must
// take the garbage as the attempt's failure (not throw), then restart.
TEST(MalformedFailureRecordTest, WorkerFailsAfterGarbage_RestartsWithoutThrowing) {
  const auto dir = hsgd::testing::unique_temp_dir("malformed_publish");
  auto store = std::make_shared<HashStore>();
  store->set("hsgd-run/attempt/0/failed", to_bytes(std::string(100000, '\x01')));
  LaunchAgent agent(
      job("touch " + dir.string() + "/ran_$HSGD_RESTART_COUNT.$RANK; [ $HSGD_RESTART_COUNT != 0 ]",
          1),
      store);
  EXPECT_EQ(agent.run(), 0);
  EXPECT_TRUE(fs::exists(dir / "ran_1.1"));
  // The record is quoted, shortened, in the message; a 100 kB value does not end up in the log.
  EXPECT_LT(agent.last_failure().value_or(FailureRecord{}).message.size(), 1000u);
}

}  // namespace
}  // namespace hsgd::comm::launcher
