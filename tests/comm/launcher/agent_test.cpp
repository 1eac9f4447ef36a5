// LaunchAgent in-process, over a HashStore, with small shell workers: the process management,
// failure propagation between nodes and restarts, without any network.

#include "comm/launcher/agent.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "comm/store/hash_store.h"
#include "shell_job.h"
#include "tests/support/multiprocess.h"

namespace hsgd::comm::launcher {
namespace {

using std::chrono::milliseconds;
namespace fs = std::filesystem;

TEST(LaunchAgentTest, AllWorkersSucceed_ReturnsZero) {
  const auto dir = hsgd::testing::unique_temp_dir("agent_ok");
  LaunchAgent agent(shell_job("echo rank $RANK of $WORLD_SIZE", dir / "logs"),
                    std::make_shared<HashStore>());
  EXPECT_EQ(agent.run(), 0);
  EXPECT_FALSE(agent.last_failure().has_value());
  std::ifstream log(dir / "logs" / "attempt_0" / "rank_1.log");
  std::string line;
  std::getline(log, line);
  EXPECT_EQ(line, "rank 1 of 2");
}

TEST(LaunchAgentTest, FailsOnce_RestartsWithRestartCountOne) {
  const auto dir = hsgd::testing::unique_temp_dir("agent_restart");
  // Rank 1 fails in attempt 0 only once rank 0 has left its mark (at most 5 s), so that the
  // restart, not a race with the shell's start-up, decides what ran.
  const std::string script = "touch " + dir.string() +
                             "/ran_$HSGD_RESTART_COUNT.$RANK; "
                             "if [ $RANK = 1 ] && [ $HSGD_RESTART_COUNT = 0 ]; then "
                             "for i in $(seq 500); do [ -e " +
                             dir.string() +
                             "/ran_0.0 ] && break; sleep 0.01; done; "
                             "echo dying on purpose >&2; exit 4; fi; "
                             "[ $HSGD_RESTART_COUNT = 0 ] && sleep 60; exit 0";
  auto options = shell_job(script, dir / "logs");
  options.max_restarts = 2;
  LaunchAgent agent(options, std::make_shared<HashStore>());
  EXPECT_EQ(agent.run(), 0);
  ASSERT_TRUE(agent.last_failure().has_value());
  EXPECT_EQ(agent.last_failure()->rank, 1);
  const std::string& msg = agent.last_failure()->message;
  EXPECT_NE(msg.find("exit code 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dying on purpose"), std::string::npos) << msg;
  EXPECT_EQ(count_files(dir, "ran_0."), 2);
  EXPECT_EQ(count_files(dir, "ran_1."), 2) << "attempt 1 must run every rank once";
  EXPECT_EQ(count_files(dir, "ran_2."), 0) << "no third attempt after a success";
}

TEST(LaunchAgentTest, AlwaysFails_ReturnsOneAfterMaxRestarts) {
  const auto dir = hsgd::testing::unique_temp_dir("agent_fail");
  auto options = shell_job("touch " + dir.string() + "/ran_$HSGD_RESTART_COUNT.$RANK; exit 9",
                           dir / "logs", 1);
  options.max_restarts = 2;
  LaunchAgent agent(options, std::make_shared<HashStore>());
  EXPECT_EQ(agent.run(), 1);
  EXPECT_EQ(count_files(dir, "ran_"), 3) << "1 attempt + 2 restarts";
  ASSERT_TRUE(agent.last_failure().has_value());
  EXPECT_NE(agent.last_failure()->message.find("exit code 9"), std::string::npos);
}

TEST(LaunchAgentTest, TwoNodes_FailureOnOneStopsBothWithOneRootCause) {
  const auto dir = hsgd::testing::unique_temp_dir("agent_two_nodes");
  // Node rank 1's first worker (global rank 2) fails, once the other ranks have recorded their
  // pids (at most 5 s), so that every rank is known to have started; everyone else would sleep
  // for a minute.
  const std::string d = dir.string();
  // The pid is written under another name and renamed: pid_$RANK exists only once it holds it.
  const std::string script = "echo $$ > " + d + "/tmp_$RANK && mv " + d + "/tmp_$RANK " + d +
                             "/pid_$RANK; "
                             "if [ $RANK = 2 ]; then for i in $(seq 500); do [ -e " +
                             d + "/pid_0 ] && [ -e " + d + "/pid_1 ] && [ -e " + d +
                             "/pid_3 ] && break; sleep 0.01; done; "
                             "echo bad rank >&2; exit 3; fi; "
                             "sleep 60";
  auto store = std::make_shared<HashStore>();
  std::vector<std::future<std::pair<int, std::optional<FailureRecord>>>> nodes;
  for (int n = 0; n < 2; ++n) {
    nodes.push_back(std::async(std::launch::async, [&, n] {
      auto options = shell_job(script, dir / ("logs" + std::to_string(n)));
      options.nnodes = 2;
      options.node_rank = n;
      LaunchAgent agent(options, store);
      int code = agent.run();
      return std::make_pair(code, agent.last_failure());
    }));
  }
  for (int n = 0; n < 2; ++n) {
    auto [code, failure] = nodes[n].get();
    EXPECT_EQ(code, 1) << "node " << n;
    ASSERT_TRUE(failure.has_value()) << "node " << n;
    EXPECT_EQ(failure->rank, 2) << "node " << n << " reports another root cause";
    EXPECT_EQ(failure->node_rank, 1);
  }
  for (int rank = 0; rank < 4; ++rank) {
    std::ifstream in(dir / ("pid_" + std::to_string(rank)));
    pid_t pid = 0;
    in >> pid;
    ASSERT_GT(pid, 0) << "rank " << rank << " never started";
    EXPECT_FALSE(process_exists(pid)) << "rank " << rank << " pid " << pid << " survived";
  }
}

TEST(LaunchAgentTest, StopRequest_ForwardsSignalThenKillsAfterGrace) {
  const auto dir = hsgd::testing::unique_temp_dir("agent_stop");
  // Rank 0 ignores SIGTERM (needs the SIGKILL), rank 1 dies of it.
  // The pid is written under another name and renamed: pid_$RANK exists only once it holds it.
  const std::string d = dir.string();
  const std::string script = "echo $$ > " + d + "/tmp_$RANK && mv " + d + "/tmp_$RANK " + d +
                             "/pid_$RANK; "
                             "if [ $RANK = 0 ]; then trap '' TERM; fi; sleep 60";
  auto options = shell_job(script, dir / "logs");
  options.grace_period = milliseconds(300);
  LaunchAgent agent(options, std::make_shared<HashStore>());
  auto code = std::async(std::launch::async, [&] { return agent.run(); });
  // Wait until both workers are up, then stop.
  for (int i = 0; i < 2000 && !(fs::exists(dir / "pid_0") && fs::exists(dir / "pid_1")); ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  agent.request_stop(SIGTERM);
  EXPECT_EQ(code.get(), 128 + SIGTERM);
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(dir / ("pid_" + std::to_string(rank)));
    pid_t pid = 0;
    in >> pid;
    ASSERT_GT(pid, 0);
    EXPECT_FALSE(process_exists(pid)) << "rank " << rank << " pid " << pid << " survived";
  }
}

// An agent that finds the job's current attempt full while all its nodes keep beating is one node
// too many: it is refused and the running job goes on undisturbed.
TEST(LaunchAgentTest, ExtraNode_RefusedWhileTheJobRunsAndAfterItFinished) {
  const auto dir = hsgd::testing::unique_temp_dir("agent_extra_node");
  auto store = std::make_shared<HashStore>();
  auto options = shell_job("touch " + dir.string() + "/started; sleep 4", dir / "logs", 1);
  options.heartbeat_timeout = milliseconds(800);
  LaunchAgent running(options, store);
  auto code = std::async(std::launch::async, [&] { return running.run(); });
  for (int i = 0; i < 2000 && !fs::exists(dir / "started"); ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_TRUE(fs::exists(dir / "started"));
  auto extra_options = shell_job("touch " + dir.string() + "/extra_ran", dir / "extra_logs", 1);
  extra_options.heartbeat_timeout = milliseconds(800);
  LaunchAgent extra(extra_options, store);
  EXPECT_THROW(extra.run(), RendezvousFull);
  EXPECT_EQ(code.get(), 0);
  EXPECT_FALSE(running.last_failure().has_value()) << running.last_failure()->message;
  // Once the job finished, a late agent is told so.
  LaunchAgent late(extra_options, store);
  try {
    late.run();
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("already finished"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / "extra_ran"));
}

TEST(LaunchAgentTest, MissingProgram_FailsBeforeRendezvous) {
  auto options = shell_job("", "");
  options.program = {"hsgd-no-such-program"};
  LaunchAgent agent(options, std::make_shared<HashStore>());
  EXPECT_THROW(agent.run(), InvalidArgument);
}

}  // namespace
}  // namespace hsgd::comm::launcher
