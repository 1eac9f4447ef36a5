// hsgd-run --nnodes MIN:MAX (and PET_NNODES=MIN:MAX) runs the elastic agent: the real binary
// with shell workers that record their environment.

#include <gtest/gtest.h>

#include <filesystem>
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
    EXPECT_NE(text.find("\n" + line + "\n"), std::string::npos) << line << " missing in\n" << text;
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
    const std::string env = "\n" + slurp(dir / ("env_" + std::to_string(local)));
    expect_lines(
        env, {"HSGD_ELASTIC_MIN_NODES=1", "HSGD_ELASTIC_MAX_NODES=2",
              "HSGD_ELASTIC_HEARTBEAT_MS=5000", "HSGD_RESTART_COUNT=0",
              "LOCAL_RANK=" + std::to_string(local), "RANK=" + std::to_string(local),
              "LOCAL_WORLD_SIZE=2", "WORLD_SIZE=2", "GROUP_RANK=0", "HSGD_RUN_ID=elastic-flag"});
    EXPECT_NE(env.find("\nHSGD_ELASTIC_NODE_ID="), std::string::npos) << env;
    EXPECT_NE(env.find("-" + std::to_string(pid) + "-0\n"), std::string::npos)
        << "node id <host>-<hsgd-run pid>-0 expected\n"
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
                            "PET_RDZV_ENDPOINT=127.0.0.1:" + std::to_string(unused_port())})
          .wait(seconds(60));
  ASSERT_TRUE(result.status.success()) << show(result);
  expect_lines("\n" + slurp(dir / "env_0"),
               {"HSGD_ELASTIC_MIN_NODES=1", "HSGD_ELASTIC_MAX_NODES=2", "RANK=0", "WORLD_SIZE=1"});
}

}  // namespace
}  // namespace hsgd::testing
