#include "comm/launcher/worker_env.h"

#include <gtest/gtest.h>

#include <map>

#include "comm/error.h"
#include "comm/launcher/failure_record.h"

namespace hsgd::comm::launcher {
namespace {

std::map<std::string, std::string> as_map(const std::vector<std::string>& env) {
  std::map<std::string, std::string> m;
  for (const auto& e : env) {
    auto eq = e.find('=');
    EXPECT_EQ(m.count(e.substr(0, eq)), 0u) << "duplicate variable " << e;
    m[e.substr(0, eq)] = e.substr(eq + 1);
  }
  return m;
}

TEST(WorkerEnvTest, SetsTorchrunVariablesOverridingInheritedOnes) {
  auto env =
      as_map(build_worker_env({"PATH=/bin", "RANK=99"}, WorkerEnvOptions{.rank = 5,
                                                                         .local_rank = 1,
                                                                         .world_size = 8,
                                                                         .local_world_size = 4,
                                                                         .group_rank = 1,
                                                                         .group_world_size = 2,
                                                                         .master_addr = "10.0.0.1",
                                                                         .master_port = 29400,
                                                                         .run_id = "job7",
                                                                         .restart_count = 2}));
  EXPECT_EQ(env["PATH"], "/bin");
  EXPECT_EQ(env["RANK"], "5");
  EXPECT_EQ(env["LOCAL_RANK"], "1");
  EXPECT_EQ(env["WORLD_SIZE"], "8");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(env["GROUP_RANK"], "1");
  EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.1");
  EXPECT_EQ(env["MASTER_PORT"], "29400");
  EXPECT_EQ(env["HSGD_RUN_ID"], "job7");
  EXPECT_EQ(env["HSGD_JOB_ID"], "job7");
  EXPECT_EQ(env["HSGD_RESTART_COUNT"], "2");
  EXPECT_EQ(env.count("HSGD_RDZV_TOKEN"), 0u);
}

// The job's transport is its own: a token for a TLS job, HSGD_INSECURE=1 and no token for an
// insecure one, whatever the environment hsgd-run inherited (an outer job's) said.
TEST(WorkerEnvTest, TokenOrInsecure_NeverInheritedFromAnOuterJob) {
  const std::vector<std::string> outer = {"HSGD_INSECURE=1", "HSGD_RDZV_TOKEN=outer",
                                          "HSGD_TOKEN_FILE=/outer"};
  auto secure = as_map(build_worker_env(outer, WorkerEnvOptions{.token = "inner"}));
  EXPECT_EQ(secure["HSGD_RDZV_TOKEN"], "inner");
  EXPECT_EQ(secure.count("HSGD_INSECURE"), 0u);
  auto insecure = as_map(build_worker_env(outer, WorkerEnvOptions{.insecure = true}));
  EXPECT_EQ(insecure["HSGD_INSECURE"], "1");
  EXPECT_EQ(insecure.count("HSGD_RDZV_TOKEN"), 0u);
  EXPECT_EQ(insecure.count("HSGD_TOKEN_FILE"), 0u);
}

TEST(WorkerEnvTest, ThreadVariables_OneWhenSeveralWorkersUnlessUserSetThem) {
  auto several =
      as_map(build_worker_env({"OMP_NUM_THREADS=3"}, WorkerEnvOptions{.local_world_size = 2}));
  EXPECT_EQ(several["OMP_NUM_THREADS"], "3");  // the user's choice wins
  EXPECT_EQ(several["HSGD_NUM_THREADS"], "1");
  EXPECT_EQ(several["OPENBLAS_NUM_THREADS"], "1");
  auto single = as_map(build_worker_env({}, WorkerEnvOptions{.local_world_size = 1}));
  EXPECT_EQ(single.count("OMP_NUM_THREADS"), 0u);
  EXPECT_EQ(single.count("HSGD_NUM_THREADS"), 0u);
}

TEST(FailureRecordTest, RoundTripsWithMultiLineMessage) {
  FailureRecord r{.kind = FailureRecord::Kind::kInterrupted,
                  .node_rank = 1,
                  .rank = 6,
                  .signal = 15,
                  .message = "line one\n  line two\n"};
  FailureRecord back = FailureRecord::decode(r.encode());
  EXPECT_EQ(back.kind, r.kind);
  EXPECT_EQ(back.node_rank, 1);
  EXPECT_EQ(back.rank, 6);
  EXPECT_EQ(back.signal, 15);
  EXPECT_EQ(back.message, r.message);
  EXPECT_FALSE(back.restartable());
  EXPECT_THROW(FailureRecord::decode("garbage"), CommError);
}

}  // namespace
}  // namespace hsgd::comm::launcher
