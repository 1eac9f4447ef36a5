// hsgd-run started the way Kubeflow's PyTorchJob starts torchrun: with torchrun's arguments as
// PET_* variables and no flags. Two hsgd-run processes on loopback play the master and the
// worker pod; node 0 hosts the rendezvous server on PET_MASTER_ADDR:PET_MASTER_PORT (or
// PET_RDZV_ENDPOINT). Every process is started through Command, which kills it at the end.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "command.h"
#include "tests/support/multiprocess.h"

namespace hsgd::testing {
namespace {

using std::chrono::seconds;
namespace fs = std::filesystem;

const std::string kRun = HSGD_RUN_PATH;
const std::string kWorker = LAUNCHER_TEST_WORKER_PATH;

// Runs two "pods" with the given per-pod PET_* variables (plus PET_NODE_RANK) and the worker
// program in `mode`; both must exit 0.
void run_two_pods(const std::vector<std::string>& pet, const std::string& mode,
                  const fs::path& dir) {
  std::vector<Command> pods;
  for (int node = 0; node < 2; ++node) {
    std::vector<std::string> env = pet;
    env.push_back("PET_NODE_RANK=" + std::to_string(node));
    env.push_back("HSGD_TOKEN_FILE=" + test_token_file());  // as a mounted Secret would
    pods.push_back(Command::start({kRun, "--", kWorker, mode, dir.string()}, env));
  }
  for (int node = 0; node < 2; ++node) {
    const auto result = pods[node].wait(seconds(90));
    EXPECT_TRUE(result.status.success()) << "pod " << node << "\n" << show(result);
  }
}

TEST(HsgdRunTorchEnvTest, MasterAddrAndPort_TwoPodsOfTwoWorkers) {
  const auto dir = unique_temp_dir("hsgd_run_pet_master");
  const int port = unused_port();
  run_two_pods({"PET_NNODES=2", "PET_NPROC_PER_NODE=2", "PET_MASTER_ADDR=127.0.0.1",
                "PET_MASTER_PORT=" + std::to_string(port)},
               "env", dir);
  for (int rank = 0; rank < 4; ++rank) {
    const std::string env = slurp(dir / ("env_attempt0_rank" + std::to_string(rank)));
    EXPECT_NE(env.find("RANK=" + std::to_string(rank) + "\n"), std::string::npos) << env;
    EXPECT_NE(env.find("WORLD_SIZE=4\n"), std::string::npos) << env;
    EXPECT_NE(env.find("LOCAL_WORLD_SIZE=2\n"), std::string::npos) << env;
    EXPECT_NE(env.find("GROUP_RANK=" + std::to_string(rank / 2) + "\n"), std::string::npos) << env;
    EXPECT_NE(env.find("MASTER_ADDR=127.0.0.1\n"), std::string::npos) << env;
    EXPECT_NE(env.find("MASTER_PORT=" + std::to_string(port) + "\n"), std::string::npos) << env;
  }
}

TEST(HsgdRunTorchEnvTest, RdzvEndpointC10d_AllreduceAcrossPods) {
  const auto dir = unique_temp_dir("hsgd_run_pet_c10d");
  run_two_pods(
      {"PET_NNODES=2:2", "PET_NPROC_PER_NODE=2", "PET_RDZV_BACKEND=c10d", "PET_RDZV_ID=pet-job",
       "PET_RDZV_ENDPOINT=127.0.0.1:" + std::to_string(unused_port()),
       // Not used when PET_RDZV_ENDPOINT is set (torchrun's rule too).
       "PET_MASTER_ADDR=no-such-host.invalid", "PET_MASTER_PORT=1"},
      "allreduce", dir);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(fs::exists(dir / ("allreduce_rank" + std::to_string(rank)))) << "rank " << rank;
  }
}

TEST(HsgdRunTorchEnvTest, FlagsWinOverVariables) {
  const auto dir = unique_temp_dir("hsgd_run_pet_flags");
  const auto result =
      Command::start({kRun, "--nproc-per-node", "1", "--nnodes", "1", "--rdzv-id", "flag-job", "--",
                      kWorker, "env", dir.string()},
                     {"PET_NPROC_PER_NODE=3", "PET_NNODES=2", "PET_RDZV_ID=pet-job"})
          .wait(seconds(60));
  ASSERT_TRUE(result.status.success()) << show(result);
  const std::string env = slurp(dir / "env_attempt0_rank0");
  EXPECT_NE(env.find("WORLD_SIZE=1\n"), std::string::npos) << env;
  EXPECT_NE(env.find("HSGD_RUN_ID=flag-job\n"), std::string::npos) << env;
  EXPECT_FALSE(fs::exists(dir / "env_attempt0_rank1"));
}

TEST(HsgdRunTorchEnvTest, BadValuesAreUsageErrorsNamingTheVariable) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"PET_NNODES=3:2", "PET_NNODES='3:2': expected MIN:MAX with MIN <= MAX"},
      {"PET_NNODES=0:2", "PET_NNODES='0:2': expected MIN:MAX"},
      {"PET_NNODES=zero", "PET_NNODES='zero': expected a whole number"},
      {"PET_NPROC_PER_NODE=four", "PET_NPROC_PER_NODE='four': expected a whole number"},
      {"PET_NPROC_PER_NODE=gpu", "PET_NPROC_PER_NODE='gpu': expected a number, 'auto' or 'cpu'"},
      {"PET_RDZV_BACKEND=etcd", "PET_RDZV_BACKEND='etcd': expected static or c10d"},
      {"PET_MASTER_PORT=70000", "PET_MASTER_PORT='70000': expected a whole number from 1 to"}};
  for (const auto& [variable, message] : cases) {
    std::vector<std::string> env{variable};
    if (variable.starts_with("PET_MASTER_PORT")) env.push_back("PET_MASTER_ADDR=127.0.0.1");
    const auto result =
        Command::start({kRun, "--", kWorker, "env", "/nonexistent"}, env).wait(seconds(30));
    EXPECT_EQ(result.status.exit_code, 2) << variable << "\n" << show(result);
    EXPECT_NE(result.output.find(message), std::string::npos) << variable << "\n" << show(result);
  }
}

}  // namespace
}  // namespace hsgd::testing
