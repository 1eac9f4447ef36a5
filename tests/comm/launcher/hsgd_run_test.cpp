// hsgd-run end to end: the real launcher, the real hsgd-rendezvous and a real worker program
// (launcher_test_worker), all as separate processes on loopback. Several "nodes" are several
// hsgd-run processes. Every process is started through Command, which kills it (and its process
// group) at the end of the test at the latest.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "command.h"
#include "tests/support/multiprocess.h"

namespace hsgd::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
namespace fs = std::filesystem;

const std::string kRun = HSGD_RUN_PATH;
const std::string kRendezvous = HSGD_RENDEZVOUS_PATH;
const std::string kWorker = LAUNCHER_TEST_WORKER_PATH;
constexpr auto kJobTimeout = seconds(90);

// A zombie counts as gone: an orphan's zombie waits for a reaper we do not control (in a
// container, PID 1 may never reap it), but it runs nothing.
bool process_exists(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const auto close = text.rfind(')');
  return close == std::string::npos || close + 2 >= text.size() || text[close + 2] != 'Z';
}

bool gone_within(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (process_exists(pid)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return true;
}

// Worker pids recorded by `launcher_test_worker sleep DIR`, once all `n` ranks printed "ready".
std::vector<pid_t> wait_ready(Command& run, const fs::path& dir, int first, int n) {
  std::vector<pid_t> pids;
  for (int rank = first; rank < first + n; ++rank) {
    const std::string ready = "[rank " + std::to_string(rank) + "] ready";
    EXPECT_TRUE(run.wait_for_output(ready, seconds(60))) << run.output();
    std::istringstream pid_file(slurp(dir / ("pid_rank" + std::to_string(rank))));
    pid_t pid = 0;
    pid_file >> pid;
    pids.push_back(pid);
    EXPECT_TRUE(pids.back() > 0 && process_exists(pids.back())) << "rank " << rank;
  }
  return pids;
}

TEST(HsgdRunTest, Standalone_AllreduceOfRanksWith1_2_4Workers) {
  for (int nproc : {1, 2, 4}) {
    const auto dir = unique_temp_dir("hsgd_run_allreduce");
    auto result = Command::start({kRun, "--nproc-per-node", std::to_string(nproc), "--", kWorker,
                                  "allreduce", dir.string()})
                      .wait(kJobTimeout);
    ASSERT_TRUE(result.status.success()) << "nproc " << nproc << "\n" << show(result);
    const int sum = nproc * (nproc - 1) / 2;
    for (int rank = 0; rank < nproc; ++rank) {
      EXPECT_TRUE(fs::exists(dir / ("allreduce_rank" + std::to_string(rank))))
          << "nproc " << nproc << " rank " << rank << "\n"
          << show(result);
      const std::string line = "[rank " + std::to_string(rank) + "] allreduce sum " +
                               std::to_string(sum) + " count " + std::to_string(nproc);
      EXPECT_NE(result.output.find(line), std::string::npos) << line << "\n" << show(result);
    }
  }
}

TEST(HsgdRunTest, Standalone_WorkerEnvironmentAndFlagsFromEnv) {
  const auto dir = unique_temp_dir("hsgd_run_env");
  // --nproc-per-node from HSGD_NPROC_PER_NODE; the program without "--" (torchrun style).
  auto result = Command::start({kRun, "--rdzv-id", "env-job", kWorker, "env", dir.string()},
                               {"HSGD_NPROC_PER_NODE=2", "RANK=77"})
                    .wait(kJobTimeout);
  ASSERT_TRUE(result.status.success()) << show(result);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string env = slurp(dir / ("env_attempt0_rank" + std::to_string(rank)));
    EXPECT_NE(env.find("RANK=" + std::to_string(rank) + "\n"), std::string::npos) << env;
    EXPECT_NE(env.find("LOCAL_RANK=" + std::to_string(rank) + "\n"), std::string::npos) << env;
    EXPECT_NE(env.find("WORLD_SIZE=2\n"), std::string::npos) << env;
    EXPECT_NE(env.find("GROUP_RANK=0\n"), std::string::npos) << env;
    EXPECT_NE(env.find("MASTER_ADDR=127.0.0.1\n"), std::string::npos) << env;
    EXPECT_NE(env.find("HSGD_RUN_ID=env-job\n"), std::string::npos) << env;
    EXPECT_NE(env.find("HSGD_RESTART_COUNT=0\n"), std::string::npos) << env;
    EXPECT_NE(env.find("OMP_NUM_THREADS=1\n"), std::string::npos) << env;
  }
}

TEST(HsgdRunTest, TwoNodes_AgainstOneHsgdRendezvous) {
  auto server = start_rendezvous(kRendezvous);
  ASSERT_GT(server.port, 0);
  const auto dir = unique_temp_dir("hsgd_run_two_nodes");
  const std::string endpoint = "127.0.0.1:" + std::to_string(server.port);
  std::vector<Command> nodes;
  for (int n = 0; n < 2; ++n) {
    nodes.push_back(
        Command::start({kRun, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint", endpoint,
                        "--token-file", test_token_file(), "--rdzv-id", "two-nodes",
                        "--rdzv-timeout", "60", "--", kWorker, "allreduce", dir.string()}));
  }
  for (int n = 0; n < 2; ++n) {
    auto result = nodes[n].wait(kJobTimeout);
    EXPECT_TRUE(result.status.success()) << "node process " << n << "\n" << show(result);
    EXPECT_NE(result.output.find("node-rank"), std::string::npos) << show(result);
    EXPECT_NE(result.output.find("allreduce sum 6 count 4"), std::string::npos) << show(result);
  }
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(fs::exists(dir / ("allreduce_rank" + std::to_string(rank)))) << "rank " << rank;
  }
}

TEST(HsgdRunTest, FailsOnce_RestartsWithRestartCountOneAndSucceeds) {
  const auto dir = unique_temp_dir("hsgd_run_fail_once");
  auto result = Command::start({kRun, "--nproc-per-node", "2", "--max-restarts", "2",
                                "--grace-period", "5", "--", kWorker, "fail-once", dir.string()})
                    .wait(kJobTimeout);
  ASSERT_TRUE(result.status.success()) << show(result);
  EXPECT_NE(result.output.find("exit code 7"), std::string::npos) << show(result);
  EXPECT_NE(result.output.find("failing on purpose"), std::string::npos) << show(result);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(slurp(dir / ("ran_attempt1_rank" + std::to_string(rank))), "HSGD_RESTART_COUNT=1\n")
        << "rank " << rank;
  }
  EXPECT_FALSE(fs::exists(dir / "ran_attempt2_rank0")) << "restarted after success";
}

TEST(HsgdRunTest, AlwaysFails_NonZeroAfterRestartsWithRootCause) {
  auto result = Command::start({kRun, "--nproc-per-node", "3", "--max-restarts", "1",
                                "--grace-period", "5", "--", kWorker, "always-fail"})
                    .wait(kJobTimeout);
  EXPECT_FALSE(result.timed_out) << show(result);
  EXPECT_EQ(result.status.exit_code, 1) << show(result);
  EXPECT_NE(result.output.find("failed after 1 restart(s)"), std::string::npos) << show(result);
  // The root cause: first failing rank, its exit status and its last lines.
  const std::regex root("Root cause: rank 1 \\(node 0 .*exit code 3 in attempt 1");
  EXPECT_TRUE(std::regex_search(result.output, root)) << show(result);
  EXPECT_NE(result.output.find("    [rank 1] boom: rank 1 gives up"), std::string::npos)
      << show(result);
}

TEST(HsgdRunTest, MissingNode_ClearErrorWithinTimeout) {
  auto server = start_rendezvous(kRendezvous);
  ASSERT_GT(server.port, 0);
  const auto dir = unique_temp_dir("hsgd_run_missing");
  auto result = Command::start({kRun, "--nnodes", "2", "--rdzv-endpoint",
                                "127.0.0.1:" + std::to_string(server.port), "--token-file",
                                test_token_file(), "--rdzv-id", "lonely", "--rdzv-timeout", "2",
                                "--", kWorker, "env", dir.string()})
                    .wait(kJobTimeout);
  EXPECT_FALSE(result.timed_out) << show(result);
  EXPECT_EQ(result.status.exit_code, 1) << show(result);
  EXPECT_NE(result.output.find("1 of 2 nodes joined"), std::string::npos) << show(result);
  EXPECT_NE(result.output.find("1 missing"), std::string::npos) << show(result);
  EXPECT_TRUE(fs::is_empty(dir)) << "a worker started without its peers";
}

TEST(HsgdRunTest, UnreachableEndpoint_ClearErrorNamingHostPort) {
  const auto dir = unique_temp_dir("hsgd_run_unreachable");
  const std::string endpoint = "127.0.0.1:" + std::to_string(unused_port());
  auto result =
      Command::start({kRun, "--nnodes", "2", "--rdzv-endpoint", endpoint, "--token-file",
                      test_token_file(), "--rdzv-timeout", "2", "--", kWorker, "env", dir.string()})
          .wait(kJobTimeout);
  EXPECT_FALSE(result.timed_out) << show(result);
  EXPECT_EQ(result.status.exit_code, 1) << show(result);
  EXPECT_NE(result.output.find("cannot reach the rendezvous endpoint " + endpoint),
            std::string::npos)
      << show(result);
  EXPECT_TRUE(fs::is_empty(dir)) << "a worker started without a store";
}

TEST(HsgdRunTest, Sigterm_AllWorkersGoneWithinGracePeriod) {
  const auto dir = unique_temp_dir("hsgd_run_sigterm");
  // Every worker ignores SIGTERM: hsgd-run must escalate to SIGKILL after --grace-period.
  auto run = Command::start({kRun, "--nproc-per-node", "3", "--grace-period", "1", "--", kWorker,
                             "sleep", dir.string(), "ignore-term"});
  auto pids = wait_ready(run, dir, 0, 3);
  run.signal(SIGTERM);
  auto result = run.wait(seconds(60));
  EXPECT_FALSE(result.timed_out) << show(result);
  EXPECT_EQ(result.status.exit_code, 128 + SIGTERM) << show(result);
  EXPECT_NE(result.output.find("sent SIGKILL"), std::string::npos) << show(result);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_FALSE(process_exists(pids[rank]))
        << "rank " << rank << " pid " << pids[rank] << " survived hsgd-run";
  }
}

TEST(HsgdRunTest, Sigint_IsForwardedToWorkers) {
  const auto dir = unique_temp_dir("hsgd_run_sigint");
  auto run = Command::start(
      {kRun, "--nproc-per-node", "2", "--", kWorker, "sleep", dir.string(), "report"});
  auto pids = wait_ready(run, dir, 0, 2);
  run.signal(SIGINT);
  auto result = run.wait(seconds(60));
  EXPECT_EQ(result.status.exit_code, 128 + SIGINT) << show(result);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string line =
        "[rank " + std::to_string(rank) + "] got signal " + std::to_string(SIGINT);
    EXPECT_NE(result.output.find(line), std::string::npos) << line << "\n" << show(result);
    EXPECT_FALSE(process_exists(pids[rank])) << "rank " << rank;
  }
}

TEST(HsgdRunTest, Sigkill_WorkersDieWithTheLauncher) {
  const auto dir = unique_temp_dir("hsgd_run_sigkill");
  auto run = Command::start(
      {kRun, "--nproc-per-node", "2", "--", kWorker, "sleep", dir.string(), "ignore-term"});
  auto pids = wait_ready(run, dir, 0, 2);
  run.signal(SIGKILL);  // no chance to clean up: PR_SET_PDEATHSIG must do it
  auto result = run.wait(seconds(30));
  EXPECT_EQ(result.status.signal, SIGKILL) << show(result);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(gone_within(pids[rank], seconds(10)))
        << "rank " << rank << " pid " << pids[rank] << " outlived a SIGKILLed hsgd-run";
  }
}

TEST(HsgdRunTest, TwoNodes_FailureOnOneNodeRestartsBoth) {
  auto server = start_rendezvous(kRendezvous);
  ASSERT_GT(server.port, 0);
  const auto dir = unique_temp_dir("hsgd_run_two_nodes_restart");
  const std::string endpoint = "127.0.0.1:" + std::to_string(server.port);
  std::vector<Command> nodes;
  // Node rank 1 is started first: ranks follow --node-rank, not arrival. Rank 1 (node 0) fails.
  for (int node_rank : {1, 0}) {
    nodes.push_back(Command::start({kRun,
                                    "--nnodes",
                                    "2",
                                    "--node-rank",
                                    std::to_string(node_rank),
                                    "--nproc-per-node",
                                    "2",
                                    "--max-restarts",
                                    "1",
                                    "--rdzv-endpoint",
                                    endpoint,
                                    "--token-file",
                                    test_token_file(),
                                    "--rdzv-id",
                                    "restart-both",
                                    "--rdzv-timeout",
                                    "60",
                                    "--",
                                    kWorker,
                                    "fail-once",
                                    dir.string()}));
  }
  for (auto& node : nodes) {
    auto result = node.wait(kJobTimeout);
    EXPECT_TRUE(result.status.success()) << show(result);
    EXPECT_NE(result.output.find("Root cause: rank 1 (node 0"), std::string::npos) << show(result);
  }
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(slurp(dir / ("ran_attempt1_rank" + std::to_string(rank))), "HSGD_RESTART_COUNT=1\n")
        << "rank " << rank << " was not restarted";
  }
}

TEST(HsgdRunTest, TwoNodes_SigtermOnOneNodeStopsBoth) {
  auto server = start_rendezvous(kRendezvous);
  ASSERT_GT(server.port, 0);
  const auto dir = unique_temp_dir("hsgd_run_two_nodes_sigterm");
  const std::string endpoint = "127.0.0.1:" + std::to_string(server.port);
  std::vector<Command> nodes;
  for (int node_rank : {0, 1}) {
    nodes.push_back(Command::start({kRun,
                                    "--nnodes",
                                    "2",
                                    "--node-rank",
                                    std::to_string(node_rank),
                                    "--nproc-per-node",
                                    "1",
                                    "--max-restarts",
                                    "3",
                                    "--grace-period",
                                    "1",
                                    "--rdzv-endpoint",
                                    endpoint,
                                    "--token-file",
                                    test_token_file(),
                                    "--rdzv-id",
                                    "stop-both",
                                    "--rdzv-timeout",
                                    "60",
                                    "--",
                                    kWorker,
                                    "sleep",
                                    dir.string()}));
  }
  auto pids = wait_ready(nodes[0], dir, 0, 1);
  auto more = wait_ready(nodes[1], dir, 1, 1);
  pids.insert(pids.end(), more.begin(), more.end());
  nodes[0].signal(SIGTERM);
  auto first = nodes[0].wait(seconds(60));
  auto second = nodes[1].wait(seconds(60));
  EXPECT_EQ(first.status.exit_code, 128 + SIGTERM) << show(first);
  EXPECT_EQ(second.status.exit_code, 1) << show(second);
  EXPECT_NE(second.output.find("node 0 received SIGTERM"), std::string::npos) << show(second);
  EXPECT_EQ(second.output.find("restarting"), std::string::npos) << "an interrupt must not restart";
  for (size_t i = 0; i < pids.size(); ++i) EXPECT_FALSE(process_exists(pids[i])) << "rank " << i;
}

TEST(HsgdRunTest, TokenFile_ReachesServerAndWorkers) {
  const auto dir = unique_temp_dir("hsgd_run_token");
  const auto token = dir / "token";
  std::ofstream(token) << "s3cret-token\n";
  auto result = Command::start({kRun, "--nproc-per-node", "2", "--token-file", token.string(), "--",
                                kWorker, "allreduce", dir.string()})
                    .wait(kJobTimeout);
  ASSERT_TRUE(result.status.success()) << show(result);
  EXPECT_TRUE(fs::exists(dir / "allreduce_rank1")) << show(result);
}

TEST(HsgdRunTest, TwoNodes_DeadLauncherIsNoticedByHeartbeat) {
  auto server = start_rendezvous(kRendezvous);
  ASSERT_GT(server.port, 0);
  const auto dir = unique_temp_dir("hsgd_run_heartbeat");
  const std::string endpoint = "127.0.0.1:" + std::to_string(server.port);
  std::vector<Command> nodes;
  for (int node_rank : {0, 1}) {
    nodes.push_back(Command::start({kRun,
                                    "--nnodes",
                                    "2",
                                    "--node-rank",
                                    std::to_string(node_rank),
                                    "--heartbeat-timeout",
                                    "2",
                                    "--grace-period",
                                    "1",
                                    "--rdzv-endpoint",
                                    endpoint,
                                    "--token-file",
                                    test_token_file(),
                                    "--rdzv-id",
                                    "heartbeat",
                                    "--rdzv-timeout",
                                    "60",
                                    "--",
                                    kWorker,
                                    "sleep",
                                    dir.string()}));
  }
  auto pids = wait_ready(nodes[0], dir, 0, 1);
  auto more = wait_ready(nodes[1], dir, 1, 1);
  pids.insert(pids.end(), more.begin(), more.end());
  nodes[0].signal(SIGKILL);  // node 0 vanishes without telling anyone
  auto result = nodes[1].wait(seconds(60));
  EXPECT_FALSE(result.timed_out) << show(result);
  EXPECT_EQ(result.status.exit_code, 1) << show(result);
  EXPECT_NE(result.output.find("node 0 ("), std::string::npos) << show(result);
  EXPECT_NE(result.output.find("sent no heartbeat"), std::string::npos) << show(result);
  for (size_t i = 0; i < pids.size(); ++i) {
    EXPECT_TRUE(gone_within(pids[i], seconds(10))) << "rank " << i << " pid " << pids[i];
  }
}

}  // namespace
}  // namespace hsgd::testing
