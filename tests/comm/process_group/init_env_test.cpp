// InitOptions::from_env: torchrun variables, a task started by srun, hsgd-run's restart prefix, and
// errors naming the variable. Each case runs in a forked child so the environment changes
// never leak into other tests.

#include <gtest/gtest.h>

#include <cstdlib>

#include "comm/error.h"
#include "comm/process_group/process_group.h"
#include "comm/process_group/slurm_env.h"
#include "tests/support/multiprocess.h"

namespace hsgd::comm {
namespace {

using namespace std::chrono_literals;

const char* const kVars[] = {"RANK",
                             "WORLD_SIZE",
                             "LOCAL_RANK",
                             "LOCAL_WORLD_SIZE",
                             "GROUP_RANK",
                             "MASTER_ADDR",
                             "MASTER_PORT",
                             "HSGD_RUN_ID",
                             "HSGD_RESTART_COUNT",
                             "HSGD_RDZV_TOKEN",
                             "HSGD_INSECURE",
                             "HSGD_SOCKET_IFNAME",
                             "SLURM_PROCID",
                             "SLURM_NTASKS",
                             "SLURM_LOCALID",
                             "SLURM_NODEID",
                             "SLURM_STEP_NUM_NODES",
                             "SLURM_STEP_TASKS_PER_NODE",
                             "SLURM_STEP_NODELIST",
                             "SLURM_JOB_ID",
                             "SLURM_STEP_ID",
                             "HSGD_TIMEOUT_MS",
                             "HSGD_JOB_ID",
                             "HSGD_ALLREDUCE_ALGORITHM"};

// Runs body in a child with exactly the given variables set.
void with_env(std::vector<std::pair<const char*, const char*>> vars,
              const std::function<void()>& body) {
  auto result = hsgd::testing::run_ranks(1, 30s, [&](int) {
    for (const char* v : kVars) ::unsetenv(v);
    for (auto [k, v] : vars) ::setenv(k, v, 1);
    body();
  });
  EXPECT_RANKS_OK(result);
}

void expect_invalid(std::vector<std::pair<const char*, const char*>> vars,
                    const std::string& expected_in_message) {
  with_env(vars, [&] {
    try {
      InitOptions::from_env();
      ADD_FAILURE() << "expected InvalidArgument mentioning " << expected_in_message;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(expected_in_message), std::string::npos) << e.what();
    }
  });
}

TEST(InitEnvTest, NoVariablesMeansWorldOfOne) {
  with_env({}, [] {
    auto o = InitOptions::from_env();
    EXPECT_EQ(o.rank, 0);
    EXPECT_EQ(o.world_size, 1);
    EXPECT_TRUE(o.embedded_server);
    auto pg = init_process_group(o);
    EXPECT_EQ(pg->size(), 1);
  });
}

TEST(InitEnvTest, TorchrunVariables) {
  with_env({{"RANK", "5"},
            {"WORLD_SIZE", "8"},
            {"LOCAL_RANK", "1"},
            {"LOCAL_WORLD_SIZE", "4"},
            {"MASTER_ADDR", "::1"},
            {"MASTER_PORT", "1234"},
            {"HSGD_RDZV_TOKEN", "secret"},
            {"HSGD_TIMEOUT_MS", "1500"}},
           [] {
             auto o = InitOptions::from_env();
             EXPECT_EQ(o.rank, 5);
             EXPECT_EQ(o.world_size, 8);
             EXPECT_EQ(o.local_rank, 1);
             EXPECT_EQ(o.local_world_size, 4);
             EXPECT_EQ(o.master_addr, "::1");
             EXPECT_EQ(o.master_port, 1234);
             EXPECT_EQ(o.token, "secret");
             EXPECT_EQ(o.timeout, 1500ms);
             EXPECT_TRUE(o.key_prefix.empty());
             // No GROUP_RANK: the node is not declared (groups by node then follow
             // LOCAL_WORLD_SIZE, comm/process_group/node_layout.h), not "node 0" for every rank.
             EXPECT_EQ(o.node_rank, -1);
           });
}

TEST(InitEnvTest, HsgdRunSetsRestartPrefixAndNoEmbeddedServer) {
  with_env(
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"HSGD_RUN_ID", "job7"}, {"HSGD_RESTART_COUNT", "3"}},
      [] {
        auto o = InitOptions::from_env();
        EXPECT_EQ(o.key_prefix, "job7/3/");
        EXPECT_FALSE(o.embedded_server);
      });
}

// What srun sets for rank 5 of `srun -N 4 -n 7` (2,2,2,1 tasks on node01..03 and node07).
std::vector<std::pair<const char*, const char*>> srun_task(
    std::vector<std::pair<const char*, const char*>> extra = {}) {
  std::vector<std::pair<const char*, const char*>> vars = {
      {"SLURM_PROCID", "5"},
      {"SLURM_NTASKS", "7"},
      {"SLURM_LOCALID", "1"},
      {"SLURM_NODEID", "2"},
      {"SLURM_STEP_NUM_NODES", "4"},
      {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"},
      {"SLURM_STEP_NODELIST", "node[01-03,07]"},
      {"SLURM_JOB_ID", "123456"},
      {"SLURM_STEP_ID", "2"}};
  vars.insert(vars.end(), extra.begin(), extra.end());
  return vars;
}

TEST(InitEnvTest, SrunTaskTakesItsPlaceFromSlurm) {
  with_env(srun_task(), [] {
    auto o = InitOptions::from_env();
    EXPECT_EQ(o.rank, 5);
    EXPECT_EQ(o.world_size, 7);
    EXPECT_EQ(o.local_rank, 1);
    EXPECT_EQ(o.local_world_size, 2);
    EXPECT_EQ(o.node_rank, 2);
    EXPECT_EQ(o.master_addr, "node01");
    EXPECT_EQ(o.master_port, slurm_rendezvous_port(123456, 2));
    EXPECT_TRUE(o.embedded_server);  // rank 0 hosts the server, as with env://
    // The node layout, for the intra-node group and shared memory, as hsgd-run exports it.
    EXPECT_STREQ(std::getenv("LOCAL_WORLD_SIZE"), "2");
    EXPECT_STREQ(std::getenv("GROUP_RANK"), "2");
  });
}

TEST(InitEnvTest, MasterAddressAndPortOverrideSlurm) {
  with_env(srun_task({{"MASTER_ADDR", "10.0.0.9"}, {"MASTER_PORT", "4321"}}), [] {
    auto o = InitOptions::from_env();
    EXPECT_EQ(o.master_addr, "10.0.0.9");
    EXPECT_EQ(o.master_port, 4321);
    EXPECT_EQ(o.rank, 5);
  });
}

TEST(InitEnvTest, TorchrunVariablesTakePrecedenceOverSlurm) {
  // hsgd-run started by srun: its workers inherit SLURM_* but are placed by RANK etc.
  with_env(srun_task({{"RANK", "3"},
                      {"WORLD_SIZE", "4"},
                      {"LOCAL_RANK", "1"},
                      {"LOCAL_WORLD_SIZE", "2"},
                      {"GROUP_RANK", "1"},
                      {"MASTER_ADDR", "127.0.0.1"},
                      {"MASTER_PORT", "29411"}}),
           [] {
             auto o = InitOptions::from_env();
             EXPECT_EQ(o.rank, 3);
             EXPECT_EQ(o.world_size, 4);
             EXPECT_EQ(o.local_rank, 1);
             EXPECT_EQ(o.local_world_size, 2);
             EXPECT_EQ(o.node_rank, 1);
             EXPECT_EQ(o.master_port, 29411);
           });
}

TEST(InitEnvTest, BatchScriptWithoutSrunIsAWorldOfOne) {
  // sbatch -n 3: the script itself sees SLURM_PROCID=0 and SLURM_NTASKS=3 but no step.
  with_env({{"SLURM_PROCID", "0"},
            {"SLURM_NTASKS", "3"},
            {"SLURM_LOCALID", "0"},
            {"SLURM_NODEID", "0"},
            {"SLURM_JOB_ID", "3"}},
           [] {
             auto o = InitOptions::from_env();
             EXPECT_EQ(o.rank, 0);
             EXPECT_EQ(o.world_size, 1);
             EXPECT_EQ(std::getenv("LOCAL_WORLD_SIZE"), nullptr);
           });
}

TEST(InitEnvTest, RankZeroOffTheFirstNodeNeedsMasterAddr) {
  expect_invalid(srun_task({{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}}), "set MASTER_ADDR");
  with_env(srun_task({{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"MASTER_ADDR", "h"}}),
           [] { EXPECT_EQ(InitOptions::from_env().master_addr, "h"); });
}

TEST(InitEnvTest, BadValuesNameTheVariable) {
  expect_invalid({{"RANK", "4"}, {"WORLD_SIZE", "4"}}, "RANK=4");
  expect_invalid({{"RANK", "abc"}, {"WORLD_SIZE", "4"}}, "RANK='abc'");
  expect_invalid({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE=0");
  expect_invalid({{"RANK", "0"}}, "WORLD_SIZE");
  expect_invalid({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}},
                 "MASTER_PORT=70000");
  expect_invalid(
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
      "LOCAL_RANK=2");
  expect_invalid(srun_task({{"SLURM_PROCID", "x"}}), "SLURM_PROCID='x'");
  expect_invalid(srun_task({{"SLURM_STEP_TASKS_PER_NODE", "2(x3)"}}),
                 "SLURM_STEP_TASKS_PER_NODE='2(x3)' lists 3 nodes");
}

// HSGD_ALLREDUCE_ALGORITHM takes the names to_string gives (the group then uses that algorithm);
// any other text is refused with the valid names (empty, like the other variables, is unset).
TEST(InitEnvTest, AllreduceAlgorithmByName) {
  for (const std::string& name : hsgd::comm::allreduce_algorithm_names()) {
    const auto algorithm = hsgd::comm::parse_allreduce_algorithm(name);
    ASSERT_TRUE(algorithm.has_value()) << name;
    EXPECT_EQ(hsgd::comm::to_string(*algorithm), name);
  }
  with_env({}, [] {
    EXPECT_EQ(InitOptions::from_env().allreduce_algorithm, hsgd::comm::AllreduceAlgorithm::kAuto);
  });
  with_env({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"HSGD_ALLREDUCE_ALGORITHM", "ring"}}, [] {
    const InitOptions options = InitOptions::from_env();
    EXPECT_EQ(options.allreduce_algorithm, hsgd::comm::AllreduceAlgorithm::kRing);
    auto pg = init_process_group(options);
    EXPECT_EQ(pg->allreduce_algorithm(), hsgd::comm::AllreduceAlgorithm::kRing);
  });
  expect_invalid({{"HSGD_ALLREDUCE_ALGORITHM", "Ring"}},
                 "HSGD_ALLREDUCE_ALGORITHM='Ring' must be one of auto, halving-doubling, "
                 "ring-chunked, ring, pinned-ring, direct, direct-scatter");
}

TEST(InitEnvTest, InsecureIsZeroOrOne) {
  with_env({}, [] { EXPECT_FALSE(InitOptions::from_env().insecure); });
  with_env({{"HSGD_INSECURE", "1"}}, [] { EXPECT_TRUE(InitOptions::from_env().insecure); });
  with_env({{"HSGD_INSECURE", "0"}}, [] { EXPECT_FALSE(InitOptions::from_env().insecure); });
  expect_invalid({{"HSGD_INSECURE", "yes"}},
                 "HSGD_INSECURE='yes' must be 0 (TLS between ranks, the default) or 1 (plain TCP, "
                 "unencrypted)");
}

// Timeouts beyond a year (and numbers beyond 64 bits) are refused by name instead of
// overflowing the deadline arithmetic and failing every collective at once.
TEST(InitEnvTest, TimeoutOutOfRangeIsRefused) {
  const std::string range = "must be between 1 and 31536000000";
  expect_invalid({{"HSGD_TIMEOUT_MS", "9223372036854775807"}},
                 "HSGD_TIMEOUT_MS=9223372036854775807 " + range);
  expect_invalid({{"HSGD_TIMEOUT_MS", "9223372036854775"}},
                 "HSGD_TIMEOUT_MS=9223372036854775 " + range);
  expect_invalid({{"HSGD_TIMEOUT_MS", "99999999999999999999"}},
                 "HSGD_TIMEOUT_MS='99999999999999999999' " + range);
  expect_invalid({{"HSGD_TIMEOUT_MS", "0"}}, "HSGD_TIMEOUT_MS=0 " + range);
  with_env({{"HSGD_TIMEOUT_MS", "31536000000"}},
           [] { EXPECT_EQ(InitOptions::from_env().timeout.count(), 31536000000); });
  with_env({{"RANK", "0"}, {"WORLD_SIZE", "1"}}, [] {
    InitOptions options = InitOptions::from_env();
    options.timeout = hsgd::comm::Duration(int64_t{1} << 62);
    try {
      init_process_group(options);
      ADD_FAILURE() << "a timeout of 2^62 ms was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("timeout 4611686018427387904 ms must be between 1 and "
                                           "31536000000"),
                std::string::npos)
          << e.what();
    }
  });
}

TEST(InitEnvTest, SocketInterfaceMustExist) {
  EXPECT_EQ(gloo_bind_address("127.0.0.1", ""), "127.0.0.1");
  EXPECT_EQ(gloo_bind_address("127.0.0.1", "lo"), "127.0.0.1");
  EXPECT_THROW(gloo_bind_address("127.0.0.1", "no-such-if0"), InvalidArgument);
}

}  // namespace
}  // namespace hsgd::comm
