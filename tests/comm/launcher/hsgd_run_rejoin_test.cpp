// A node whose hsgd-run and workers were killed (kill -9) and which is started again with the
// same command joins the job's current attempt, whether the other nodes have already moved on to
// the next attempt or have not noticed the loss yet. Two hsgd-run processes on loopback against
// one hsgd-rendezvous; every process is started through Command (killed by pid at the end at the
// latest), and the killed worker by the pid it recorded.

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "command.h"
#include "tests/support/multiprocess.h"

namespace hsgd::testing {
namespace {

using std::chrono::seconds;
namespace fs = std::filesystem;

const std::string kRun = HSGD_RUN_PATH;
const std::string kRendezvous = HSGD_RENDEZVOUS_PATH;
const std::string kWorker = LAUNCHER_TEST_WORKER_PATH;

// The command of node `node_rank`, as a user would type it: 2 nodes of 1 worker, 2 restarts.
// The workers of attempt 0 sleep; those of later attempts exit 0 at once.
Command start_node(const std::string& endpoint, const std::string& job, const fs::path& dir,
                   int node_rank) {
  return Command::start({kRun,
                         "--nnodes",
                         "2",
                         "--node-rank",
                         std::to_string(node_rank),
                         "--nproc-per-node",
                         "1",
                         "--max-restarts",
                         "2",
                         "--heartbeat-timeout",
                         "3",
                         "--grace-period",
                         "1",
                         "--rdzv-endpoint",
                         endpoint,
                         "--token-file",
                         test_token_file(),
                         "--rdzv-id",
                         job,
                         "--rdzv-timeout",
                         "60",
                         "--",
                         kWorker,
                         "sleep-once",
                         dir.string()});
}

// The pid the worker of `rank` recorded once it printed "ready" through `node`.
pid_t wait_ready(Command& node, const fs::path& dir, int rank) {
  const std::string ready = "[rank " + std::to_string(rank) + "] ready";
  EXPECT_TRUE(node.wait_for_output(ready, seconds(60))) << node.output();
  std::ifstream in(dir / ("pid_rank" + std::to_string(rank)));
  pid_t pid = 0;
  in >> pid;
  EXPECT_GT(pid, 0) << "rank " << rank;
  return pid;
}

// kill -9 of a node's hsgd-run and of its worker, nothing else.
void kill_node(Command& node, pid_t worker) {
  node.signal(SIGKILL);
  if (worker > 0) ::kill(worker, SIGKILL);
  const auto result = node.wait(seconds(30));
  EXPECT_EQ(result.status.signal, SIGKILL) << show(result);
}

void expect_finished_after_one_restart(const Command::Result& r, const std::string& who) {
  EXPECT_FALSE(r.timed_out) << who << "\n" << show(r);
  EXPECT_EQ(r.status.exit_code, 0) << who << "\n" << show(r);
  EXPECT_NE(r.output.find("finished: all workers of all nodes exited 0 after 1 restart(s)"),
            std::string::npos)
      << who << "\n"
      << show(r);
}

// The sequence: node 1 is killed, node 0 notices and waits in attempt 1, then node 1's
// command is run again.
TEST(HsgdRunRejoinTest, KilledNodeStartedAgainAfterTheOthersMovedOn_JoinsTheirAttempt) {
  auto server = start_rendezvous(kRendezvous);
  ASSERT_FALSE(server.endpoint.empty());
  const auto dir = unique_temp_dir("hsgd_run_rejoin_later");
  auto node0 = start_node(server.endpoint, "rejoin-later", dir, 0);
  auto node1 = start_node(server.endpoint, "rejoin-later", dir, 1);
  wait_ready(node0, dir, 0);
  const pid_t worker1 = wait_ready(node1, dir, 1);
  kill_node(node1, worker1);
  ASSERT_TRUE(node0.wait_for_output("restarting all nodes: attempt 1 of 3", seconds(60)))
      << node0.output();

  auto again = start_node(server.endpoint, "rejoin-later", dir, 1);
  const auto rejoined = again.wait(seconds(90));
  const auto survivor = node0.wait(seconds(90));
  expect_finished_after_one_restart(rejoined, "node started again");
  expect_finished_after_one_restart(survivor, "node 0");
  EXPECT_NE(rejoined.output.find("[rank 1] attempt 1 done"), std::string::npos) << show(rejoined);
  EXPECT_NE(survivor.output.find("[rank 0] attempt 1 done"), std::string::npos) << show(survivor);
}

// The race: node 1 is started again before node 0 noticed the loss (its heartbeat timeout has not
// passed), so the attempt it finds is full and still running.
TEST(HsgdRunRejoinTest, KilledNodeStartedAgainAtOnce_JoinsTheNextAttempt) {
  auto server = start_rendezvous(kRendezvous);
  ASSERT_FALSE(server.endpoint.empty());
  const auto dir = unique_temp_dir("hsgd_run_rejoin_at_once");
  auto node0 = start_node(server.endpoint, "rejoin-at-once", dir, 0);
  auto node1 = start_node(server.endpoint, "rejoin-at-once", dir, 1);
  wait_ready(node0, dir, 0);
  const pid_t worker1 = wait_ready(node1, dir, 1);
  kill_node(node1, worker1);

  auto again = start_node(server.endpoint, "rejoin-at-once", dir, 1);
  const auto rejoined = again.wait(seconds(90));
  const auto survivor = node0.wait(seconds(90));
  expect_finished_after_one_restart(rejoined, "node started again");
  expect_finished_after_one_restart(survivor, "node 0");
  // It found attempt 0 still running with both places taken, and waited for it to end.
  EXPECT_NE(rejoined.output.find("attempt 0 already has its 2 nodes"), std::string::npos)
      << show(rejoined);
  EXPECT_NE(rejoined.output.find("[rank 1] attempt 1 done"), std::string::npos) << show(rejoined);
  EXPECT_NE(survivor.output.find("[rank 0] attempt 1 done"), std::string::npos) << show(survivor);
}

}  // namespace
}  // namespace hsgd::testing
