// LaunchAgent's answer to the two exit codes of comm/launcher/exit_codes.h, in-process over a
// HashStore with shell workers: 75 (preempted, after a checkpoint) and 78 (a failure a restart
// would repeat) stop the job without a restart, on every node, and become the agent's own exit
// code; SIGUSR1 and SIGTERM to an agent reach the workers, and a repeated SIGTERM does not cut
// their grace period short.

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "comm/launcher/agent.h"
#include "comm/launcher/exit_codes.h"
#include "comm/store/hash_store.h"
#include "shell_job.h"
#include "tests/support/multiprocess.h"

namespace hsgd::comm::launcher {
namespace {

using std::chrono::milliseconds;
namespace fs = std::filesystem;

AgentOptions exit_code_job(const std::string& script, const fs::path& log_dir) {
  AgentOptions options = shell_job(script, log_dir);
  options.run_id = "agent-exit-codes-test";
  options.max_restarts = 3;
  return options;
}

void wait_for_files(const fs::path& dir, const std::string& prefix, int n) {
  for (int i = 0; i < 2000 && count_files(dir, prefix) < n; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_EQ(count_files(dir, prefix), n) << "workers did not start within 20 s";
}

// A worker that records its start (once its trap is set), then waits; on SIGUSR1 or SIGTERM it
// "checkpoints" (waits `save` seconds: the write) and exits 75. The sleep runs in the background so
// that the shell runs its trap at once.
std::string preemptible(const fs::path& dir, const std::string& save = "0") {
  const std::string d = dir.string();
  return "trap 'sleep " + save + "; touch " + d + "/saved.$RANK; exit 75' USR1 TERM; touch " + d +
         "/ran_$HSGD_RESTART_COUNT.$RANK; sleep 60 & wait $!; exit 0";
}

TEST(LaunchAgentExitCodesTest, WorkerExits78_StopsWithoutRestarts_Returns78) {
  const auto dir = hsgd::testing::unique_temp_dir("agent_78");
  // Rank 1 exits 78 once rank 0 has started (at most 5 s); rank 0 would sleep for a minute.
  const std::string d = dir.string();
  const std::string script = "touch " + d +
                             "/ran_$HSGD_RESTART_COUNT.$RANK; "
                             "if [ $RANK = 1 ]; then for i in $(seq 500); do [ -e " +
                             d + "/ran_0.0 ] && break; sleep 0.01; done; " +
                             "echo disk full >&2; exit 78; fi; sleep 60";
  LaunchAgent agent(exit_code_job(script, dir / "logs"), std::make_shared<HashStore>());
  EXPECT_EQ(agent.run(), kExitWillRepeat);
  EXPECT_EQ(count_files(dir, "ran_"), 2) << "one attempt of 2 workers, no restart";
  ASSERT_TRUE(agent.last_failure().has_value());
  EXPECT_EQ(agent.last_failure()->kind, FailureRecord::Kind::kWillRepeat);
  EXPECT_EQ(agent.last_failure()->rank, 1);
  EXPECT_NE(agent.last_failure()->message.find("disk full"), std::string::npos)
      << agent.last_failure()->message;
}

TEST(LaunchAgentExitCodesTest, TwoNodes_78OnOne_BothReturn78WithoutRestart) {
  const auto dir = hsgd::testing::unique_temp_dir("agent_78_two");
  const std::string d = dir.string();
  const std::string script = "touch " + d +
                             "/ran_$HSGD_RESTART_COUNT.$RANK; "
                             "if [ $RANK = 3 ]; then for i in $(seq 500); do [ -e " +
                             d + "/ran_0.0 ] && [ -e " + d +
                             "/ran_0.1 ] && break; sleep 0.01; done; exit 78; fi; sleep 60";
  auto store = std::make_shared<HashStore>();
  std::vector<std::future<int>> nodes;
  for (int n = 0; n < 2; ++n) {
    nodes.push_back(std::async(std::launch::async, [&, n] {
      auto options = exit_code_job(script, dir / ("logs" + std::to_string(n)));
      options.nnodes = 2;
      options.node_rank = n;
      LaunchAgent agent(options, store);
      return agent.run();
    }));
  }
  for (int n = 0; n < 2; ++n) EXPECT_EQ(nodes[n].get(), kExitWillRepeat) << "node " << n;
  EXPECT_EQ(count_files(dir, "ran_1."), 0) << "a restart happened";
}

TEST(LaunchAgentExitCodesTest, WorkersExit75_Returns75WithoutRestart) {
  const auto dir = hsgd::testing::unique_temp_dir("agent_75_self");
  // Rank 0 stops by itself (it got the signal directly, not through the agent); rank 1 is told
  // by the agent's SIGTERM, as every other worker of the job is.
  const std::string d = dir.string();
  const std::string script = "if [ $RANK = 0 ]; then touch " + d +
                             "/ran_$HSGD_RESTART_COUNT.$RANK; for i in $(seq 500); do [ -e " + d +
                             "/ran_0.1 ] && break; sleep 0.01; done; exit 75; fi; " +
                             preemptible(dir);
  LaunchAgent agent(exit_code_job(script, dir / "logs"), std::make_shared<HashStore>());
  EXPECT_EQ(agent.run(), kExitPreempted);
  EXPECT_EQ(count_files(dir, "ran_"), 2) << "one attempt of 2 workers, no restart";
  ASSERT_TRUE(agent.last_failure().has_value());
  EXPECT_EQ(agent.last_failure()->kind, FailureRecord::Kind::kPreempted);
}

TEST(LaunchAgentExitCodesTest, Sigusr1_ReachesWorkers_TheyExit75_Returns75) {
  const auto dir = hsgd::testing::unique_temp_dir("agent_usr1");
  LaunchAgent agent(exit_code_job(preemptible(dir), dir / "logs"), std::make_shared<HashStore>());
  auto code = std::async(std::launch::async, [&] { return agent.run(); });
  wait_for_files(dir, "ran_0.", 2);
  agent.request_stop(SIGUSR1);
  EXPECT_EQ(code.get(), kExitPreempted);
  EXPECT_EQ(count_files(dir, "saved."), 2);
  EXPECT_EQ(count_files(dir, "ran_1."), 0) << "a restart happened";
}

TEST(LaunchAgentExitCodesTest, Sigusr1_WorkersDieOfIt_Returns128PlusSignal) {
  const auto dir = hsgd::testing::unique_temp_dir("agent_usr1_die");
  const std::string script = "touch " + dir.string() + "/ran_$HSGD_RESTART_COUNT.$RANK; sleep 60";
  LaunchAgent agent(exit_code_job(script, dir / "logs"), std::make_shared<HashStore>());
  auto code = std::async(std::launch::async, [&] { return agent.run(); });
  wait_for_files(dir, "ran_0.", 2);
  agent.request_stop(SIGUSR1);
  EXPECT_EQ(code.get(), 128 + SIGUSR1) << "no checkpoint was written: not 75";
}

TEST(LaunchAgentExitCodesTest, RepeatedSigterm_KeepsTheGracePeriod) {
  const auto dir = hsgd::testing::unique_temp_dir("agent_usr1_term");
  // The workers take 1 s to "write their checkpoint"; SIGTERM arrives meanwhile (a scheduler's,
  // after its SIGUSR1) and must not turn into SIGKILL.
  LaunchAgent agent(exit_code_job(preemptible(dir, "1"), dir / "logs"),
                    std::make_shared<HashStore>());
  auto code = std::async(std::launch::async, [&] { return agent.run(); });
  wait_for_files(dir, "ran_0.", 2);
  agent.request_stop(SIGUSR1);
  std::this_thread::sleep_for(milliseconds(200));
  agent.request_stop(SIGTERM);
  EXPECT_EQ(code.get(), kExitPreempted);
  EXPECT_EQ(count_files(dir, "saved."), 2);
}

TEST(LaunchAgentExitCodesTest, TwoNodes_Sigusr1ToOne_BothNodesExit75) {
  const auto dir = hsgd::testing::unique_temp_dir("agent_usr1_two");
  auto store = std::make_shared<HashStore>();
  std::vector<std::unique_ptr<LaunchAgent>> agents;
  for (int n = 0; n < 2; ++n) {
    auto options = exit_code_job(preemptible(dir), dir / ("logs" + std::to_string(n)));
    options.nnodes = 2;
    options.node_rank = n;
    agents.push_back(std::make_unique<LaunchAgent>(options, store));
  }
  std::vector<std::future<int>> codes;
  for (auto& agent : agents) {
    codes.push_back(std::async(std::launch::async, [&agent] { return agent->run(); }));
  }
  wait_for_files(dir, "ran_0.", 4);
  agents[1]->request_stop(SIGUSR1);
  for (int n = 0; n < 2; ++n) EXPECT_EQ(codes[n].get(), kExitPreempted) << "node " << n;
  EXPECT_EQ(count_files(dir, "saved."), 4) << "every worker of both nodes got the signal";
  EXPECT_EQ(count_files(dir, "ran_1."), 0) << "a restart happened";
}

}  // namespace
}  // namespace hsgd::comm::launcher
