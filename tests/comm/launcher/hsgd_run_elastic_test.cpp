// hsgd-run --nnodes MIN:MAX (and PET_NNODES=MIN:MAX) runs the elastic agent: the real binary
// with shell workers that record their environment.

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "command.h"
#include "tests/support/multiprocess.h"

namespace hsgd::testing {
namespace {

using std::chrono::seconds;
namespace fs = std::filesystem;

const std::string kRun = HSGD_RUN_PATH;
const std::string kRendezvous = HSGD_RENDEZVOUS_PATH;

// Each worker writes its environment to DIR/env_<LOCAL_RANK> and exits 0.
std::vector<std::string> env_worker(const fs::path& dir) {
  return {"--", "/bin/sh", "-c", "env > " + dir.string() + "/env_$LOCAL_RANK"};
}

void expect_lines(const std::string& text, const std::vector<std::string>& lines) {
  for (const auto& line : lines) {
    const bool first = text.starts_with(line + "\n");
    EXPECT_TRUE(first || text.find("\n" + line + "\n") != std::string::npos)
        << line << " missing in\n"
        << text;
  }
}

TEST(HsgdRunElasticTest, NodeRangeFlag_WorkersGetTheElasticVariables) {
  auto server = start_rendezvous(kRendezvous);
  ASSERT_FALSE(server.endpoint.empty());
  const auto dir = unique_temp_dir("hsgd_run_elastic_flag");
  std::vector<std::string> argv = {kRun,
                                   "--nnodes",
                                   "1:2",
                                   "--nproc-per-node",
                                   "2",
                                   "--rdzv-endpoint",
                                   server.endpoint,
                                   "--token-file",
                                   test_token_file(),
                                   "--rdzv-id",
                                   "elastic-flag",
                                   "--rdzv-last-call",
                                   "0.2",
                                   "--heartbeat-timeout",
                                   "5"};
  for (const auto& arg : env_worker(dir)) argv.push_back(arg);
  auto run = Command::start(argv);
  const pid_t pid = run.pid();
  const auto result = run.wait(seconds(60));
  ASSERT_TRUE(result.status.success()) << show(result);
  EXPECT_NE(result.output.find("registered"), std::string::npos) << show(result);
  EXPECT_NE(result.output.find("job 'elastic-flag' finished"), std::string::npos) << show(result);
  for (int local = 0; local < 2; ++local) {
    const std::string env = slurp(dir / ("env_" + std::to_string(local)));
    expect_lines(
        env, {"HSGD_ELASTIC_MIN_NODES=1", "HSGD_ELASTIC_MAX_NODES=2",
              "HSGD_ELASTIC_HEARTBEAT_MS=5000", "HSGD_RESTART_COUNT=0",
              "LOCAL_RANK=" + std::to_string(local), "RANK=" + std::to_string(local),
              "LOCAL_WORLD_SIZE=2", "WORLD_SIZE=2", "GROUP_RANK=0", "HSGD_RUN_ID=elastic-flag"});
    std::string id_end = "-";
    id_end.append(std::to_string(pid)).append("-0\n");
    EXPECT_NE(env.find("HSGD_ELASTIC_NODE_ID="), std::string::npos) << env;
    EXPECT_NE(env.find(id_end), std::string::npos) << "node id <host>-<hsgd-run pid>-0 expected\n"
                                                   << env;
  }
}

TEST(HsgdRunElasticTest, PetNnodesRange_RunsElastic) {
  const auto dir = unique_temp_dir("hsgd_run_elastic_pet");
  std::vector<std::string> argv = {kRun, "--rdzv-last-call", "0"};
  for (const auto& arg : env_worker(dir)) argv.push_back(arg);
  // Node rank 0 hosts the rendezvous server on the endpoint, as under a PyTorchJob.
  const auto result =
      Command::start(argv, {"PET_NNODES=1:2", "PET_NODE_RANK=0", "PET_RDZV_ID=elastic-pet",
                            "PET_RDZV_ENDPOINT=127.0.0.1:" + std::to_string(unused_port()),
                            "HSGD_TOKEN_FILE=" + test_token_file()})
          .wait(seconds(60));
  ASSERT_TRUE(result.status.success()) << show(result);
  expect_lines(slurp(dir / "env_0"),
               {"HSGD_ELASTIC_MIN_NODES=1", "HSGD_ELASTIC_MAX_NODES=2", "RANK=0", "WORLD_SIZE=1"});
}

// One of two nodes is killed (kill -9 of its hsgd-run, its worker dies with it): the other finds
// its alive key gone (the server saw the killed agent's connections close), marks it left and
// goes on in a generation without it, and its worker is not restarted. The heartbeat timeout is
// a minute: only the alive key can tell within the 30 s the test waits.
TEST(HsgdRunElasticTest, KilledNode_TheOtherGoesOnWithoutIt) {
  auto server = start_rendezvous(kRendezvous);
  ASSERT_FALSE(server.endpoint.empty());
  const auto dir = unique_temp_dir("hsgd_run_elastic_kill");
  const std::string d = dir.string();
  auto start = [&] {
    // MAX nodes end the last call at once: generation 0 holds both.
    return Command::start({kRun, "--nnodes", "1:2", "--rdzv-endpoint", server.endpoint,
                           "--token-file", test_token_file(), "--rdzv-id", "elastic-kill",
                           "--rdzv-last-call", "30", "--heartbeat-timeout", "60", "--", "/bin/sh",
                           "-c",
                           "echo $$ >> " + d +
                               "/pid_$HSGD_ELASTIC_NODE_ID; for i in $(seq 6000); "
                               "do [ -e " +
                               d + "/finish ] && exit 0; sleep 0.01; done; exit 5"});
  };
  auto a = start();
  auto b = start();
  ASSERT_TRUE(a.wait_for_output("generation 0: 2 nodes", seconds(30))) << a.output();
  b.signal(SIGKILL);
  ASSERT_TRUE(a.wait_for_output("generation 1: 1 nodes", seconds(30))) << a.output();
  EXPECT_NE(a.output().find("closed its connections to the rendezvous server (exited or killed): "
                            "it left the job"),
            std::string::npos)
      << a.output();
  EXPECT_EQ(a.output().find("sent no heartbeat"), std::string::npos) << a.output();
  std::ofstream(dir / "finish") << "now\n";
  const auto result = a.wait(seconds(30));
  EXPECT_TRUE(result.status.success()) << show(result);
  // The surviving node's id ends with "-<its hsgd-run pid>-0".
  std::string a_id = "-";
  a_id.append(std::to_string(a.pid())).append("-0");
  int a_files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(a_id)) {
      ++a_files;
      const std::string pids = slurp(e.path());
      EXPECT_EQ(std::count(pids.begin(), pids.end(), '\n'), 1) << name << " restarted:\n" << pids;
    }
  }
  EXPECT_EQ(a_files, 1) << "the surviving node ran more than one incarnation";
}

}  // namespace
}  // namespace hsgd::testing
