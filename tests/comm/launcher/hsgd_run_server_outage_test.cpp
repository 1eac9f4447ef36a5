// The rendezvous server is not a single point of failure of a running job: hsgd-rendezvous is
// killed (kill -9, by pid) while two hsgd-run nodes train, and started again on the same port
// 10 s later. The workers keep training meanwhile, the agents re-publish the job to the new
// server, and the job ends without a restart and without a lost step. A server that stays away
// longer than --rdzv-timeout ends the job with a message that says since when, what was tried
// and what to do. Every process is started through Command (killed by pid at the end at the
// latest).

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <regex>
#include <string>

#include "comm/rendezvous/tcp_store.h"
#include "command.h"
#include "tests/support/multiprocess.h"

namespace hsgd::testing {
namespace {

using std::chrono::seconds;
namespace fs = std::filesystem;

const std::string kRun = HSGD_RUN_PATH;
const std::string kRendezvous = HSGD_RENDEZVOUS_PATH;
const std::string kWorker = LAUNCHER_TEST_WORKER_PATH;

// Long enough (at least 20 ms a step) that the job is still running when the server is back.
constexpr int kSteps = 1500;

Command start_server(int port) {
  auto cmd = Command::start({kRendezvous, "--host", "127.0.0.1", "--port", std::to_string(port),
                             "--token-file", test_token_file()});
  EXPECT_TRUE(cmd.wait_for_output("listening on 127.0.0.1:" + std::to_string(port), seconds(30)))
      << cmd.output();
  return cmd;
}

void kill_server(Command& server) {
  server.signal(SIGKILL);
  const auto result = server.wait(seconds(30));
  EXPECT_EQ(result.status.signal, SIGKILL) << show(result);
}

// Node `node_rank` of 2, one worker each, running kSteps training-like steps (allreduce, then
// progress) with rank 0 printing "step N". A restart would be allowed: none must happen.
Command start_node(int port, const std::string& job, const fs::path& dir, int node_rank,
                   int rdzv_timeout_s) {
  return Command::start({kRun,
                         "--nnodes",
                         "2",
                         "--node-rank",
                         std::to_string(node_rank),
                         "--nproc-per-node",
                         "1",
                         "--max-restarts",
                         "1",
                         "--heartbeat-timeout",
                         "3",
                         "--grace-period",
                         "2",
                         "--rdzv-endpoint",
                         "127.0.0.1:" + std::to_string(port),
                         "--token-file",
                         test_token_file(),
                         "--rdzv-id",
                         job,
                         "--rdzv-timeout",
                         std::to_string(rdzv_timeout_s),
                         "--",
                         kWorker,
                         "steps",
                         dir.string(),
                         std::to_string(kSteps)});
}

// The highest "[rank 0] step N" in output (-1: none yet).
int last_step(const std::string& output) {
  static const std::regex step_line(R"(\[rank 0\] step (\d+))");
  int last = -1;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), step_line);
       it != std::sregex_iterator(); ++it) {
    last = std::max(last, std::stoi((*it)[1]));
  }
  return last;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Reads the node's output for `d` (nothing is expected to appear).
void keep_reading(Command& node, std::chrono::milliseconds d) {
  node.wait_for_output("\x01never printed\x01", d);
}

TEST(HsgdRunServerOutageTest, ServerKilledAndStartedAgain_JobEndsWithoutRestartOrLostStep) {
  const int port = unused_port();
  auto server = start_server(port);
  const auto dir = unique_temp_dir("hsgd_run_server_outage");
  auto node0 = start_node(port, "outage", dir, 0, 60);
  auto node1 = start_node(port, "outage", dir, 1, 60);
  ASSERT_TRUE(node0.wait_for_output("[rank 0] step 50\n", seconds(90))) << node0.output();

  kill_server(server);
  const int at_kill = last_step(node0.output());
  keep_reading(node0, seconds(10));
  const int at_restart = last_step(node0.output());
  // The workers trained while the server was away, and the job is not over yet.
  EXPECT_GT(at_restart, at_kill) << node0.output();
  ASSERT_LT(at_restart, kSteps) << "the job ended before the server was back: make it longer";
  EXPECT_NE(node0.output().find("lost the rendezvous server at 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << node0.output();

  auto again = start_server(port);
  const auto r0 = node0.wait(seconds(120));
  const auto r1 = node1.wait(seconds(120));
  for (const auto* r : {&r0, &r1}) {
    EXPECT_FALSE(r->timed_out) << show(*r);
    EXPECT_EQ(r->status.exit_code, 0) << show(*r);
    EXPECT_NE(r->output.find("finished: all workers of all nodes exited 0 after 0 restart(s)"),
              std::string::npos)
        << show(*r);
    EXPECT_EQ(r->output.find("restarting all nodes"), std::string::npos) << show(*r);
    // The agent found a new server and gave it the job's keys.
    EXPECT_NE(r->output.find("is a new instance (restarted): re-published"), std::string::npos)
        << show(*r);
  }
  // Every step ran once, in one attempt: the last step is the expected one and nothing resumed.
  EXPECT_EQ(last_step(r0.output), kSteps) << show(r0);
  EXPECT_EQ(count(r0.output, "[rank 0] resumed from step 0"), 1u) << show(r0);
  EXPECT_NE(r0.output.find("0 steps lost to restarts"), std::string::npos) << show(r0);

  // The new server knows the job's members and generation: nobody wrote them after the
  // restart, the agents re-published them.
  comm::TcpStore store({.port = port,
                        .job_id = "outage",
                        .token = kLauncherTestToken,
                        .connect_timeout = seconds(10)});
  EXPECT_EQ(comm::to_string(store.get("hsgd-run/current-attempt", seconds(5))), "0");
  EXPECT_EQ(store.add("hsgd-run/attempt/0/rdzv/arrivals", 0), 2);
  EXPECT_TRUE(store.check({"hsgd-run/attempt/0/rdzv/node/0", "hsgd-run/attempt/0/rdzv/node/1"}));
}

// A worker fails while the server is away: the failure waits for the server, then the job
// restarts as usual and finishes.
TEST(HsgdRunServerOutageTest, WorkerFailsWhileServerIsAway_JobRestartsOnceItIsBack) {
  const int port = unused_port();
  auto server = start_server(port);
  const auto dir = unique_temp_dir("hsgd_run_server_outage_fail");
  constexpr int kShortRun = 300;
  constexpr int kFailStep = 60;  // rank 2 exits 9 after this step in attempt 0
  auto start = [&](int node_rank) {
    return Command::start({kRun,
                           "--nnodes",
                           "2",
                           "--node-rank",
                           std::to_string(node_rank),
                           "--nproc-per-node",
                           "2",
                           "--max-restarts",
                           "1",
                           "--heartbeat-timeout",
                           "3",
                           "--grace-period",
                           "2",
                           "--rdzv-endpoint",
                           "127.0.0.1:" + std::to_string(port),
                           "--token-file",
                           test_token_file(),
                           "--rdzv-id",
                           "outage-fail",
                           "--rdzv-timeout",
                           "60",
                           "--",
                           kWorker,
                           "steps",
                           dir.string(),
                           std::to_string(kShortRun),
                           "exit",
                           std::to_string(kFailStep)});
  };
  auto node0 = start(0);
  auto node1 = start(1);
  ASSERT_TRUE(node0.wait_for_output("[rank 0] step 5\n", seconds(90))) << node0.output();
  kill_server(server);
  ASSERT_TRUE(node1.wait_for_output("rank 2 goes silent after step " + std::to_string(kFailStep),
                                    seconds(30)))
      << node1.output();
  keep_reading(node1, seconds(8));
  // Nothing can be published meanwhile: no node has restarted yet.
  EXPECT_EQ(node0.output().find("restarting all nodes"), std::string::npos) << node0.output();
  EXPECT_EQ(node1.output().find("restarting all nodes"), std::string::npos) << node1.output();

  auto again = start_server(port);
  const auto r0 = node0.wait(seconds(120));
  const auto r1 = node1.wait(seconds(120));
  for (const auto* r : {&r0, &r1}) {
    EXPECT_FALSE(r->timed_out) << show(*r);
    EXPECT_EQ(r->status.exit_code, 0) << show(*r);
    EXPECT_NE(r->output.find("restarting all nodes: attempt 1 of 2"), std::string::npos)
        << show(*r);
    EXPECT_NE(r->output.find("finished: all workers of all nodes exited 0 after 1 restart(s)"),
              std::string::npos)
        << show(*r);
  }
  EXPECT_EQ(last_step(r0.output), kShortRun) << show(r0);
}

TEST(HsgdRunServerOutageTest, ServerAwayLongerThanTheBound_SaysSinceWhenWhatWasTriedAndWhatToDo) {
  const int port = unused_port();
  auto server = start_server(port);
  const auto dir = unique_temp_dir("hsgd_run_server_gone");
  auto node0 = start_node(port, "gone", dir, 0, 5);
  auto node1 = start_node(port, "gone", dir, 1, 5);
  ASSERT_TRUE(node0.wait_for_output("[rank 0] step 20\n", seconds(90))) << node0.output();
  kill_server(server);

  const auto r0 = node0.wait(seconds(90));
  const auto r1 = node1.wait(seconds(90));
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  for (const auto* r : {&r0, &r1}) {
    EXPECT_FALSE(r->timed_out) << show(*r);
    EXPECT_EQ(r->status.exit_code, 1) << show(*r);
    for (const std::string& part :
         {"hsgd-run: error: the rendezvous server at " + endpoint + " is unreachable since ",
          std::string(" UTC (for "), std::string("longer than --rdzv-timeout 5.0 s"),
          std::string("connection attempts with backoff"),
          std::string("the last one failed with: connect: Connection refused"),
          "Start the rendezvous server again at " + endpoint,
          std::string("Or raise --rdzv-timeout")}) {
      EXPECT_NE(r->output.find(part), std::string::npos) << "missing '" << part << "'\n"
                                                         << show(*r);
    }
  }
  // The job did not run to its end: its workers were stopped with it.
  EXPECT_LT(last_step(r0.output), kSteps) << show(r0);
}

}  // namespace
}  // namespace hsgd::testing
