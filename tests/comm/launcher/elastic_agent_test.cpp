// ElasticAgent in-process: two or three agents (threads) on one HashStore with small shell
// workers. The workers do not read the store; they leave files (pid, environment) and wait for
// files the test creates, so that the test decides when a worker fails or the job ends.

#include "comm/launcher/elastic_agent.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include "comm/store/hash_store.h"
#include "shell_job.h"
#include "tests/support/multiprocess.h"

namespace hsgd::comm::launcher {
namespace {

using elastic::Generation;
using std::chrono::milliseconds;
using std::chrono::seconds;
namespace fs = std::filesystem;

// Every worker appends its pid to pid_<node id>_<local rank> and records its environment in
// env_<node id>_<local rank>; then it exits 0 once DIR/finish exists (at most about 60 s, then
// 5). `extra` runs before the wait (e.g. to fail on a signal file).
std::string worker_script(const fs::path& dir, const std::string& extra = "") {
  const std::string d = dir.string();
  const std::string me = "${HSGD_ELASTIC_NODE_ID}_${LOCAL_RANK}";
  return "echo $$ >> " + d + "/pid_" + me + "; env > " + d + "/env_" + me + "; " + extra +
         "for i in $(seq 6000); do [ -e " + d + "/finish ] && exit 0; sleep 0.01; done; exit 5";
}

AgentOptions elastic_job(const std::string& script, const fs::path& log_dir,
                         const std::string& host, int min_nodes, int max_nodes) {
  AgentOptions options = shell_job(script, log_dir);
  options.run_id = "elastic-agent-test";
  options.hostname = host;
  options.min_nodes = min_nodes;
  options.max_nodes = max_nodes;
  options.grace_period = seconds(2);
  options.heartbeat_timeout = milliseconds(2000);
  options.last_call = milliseconds(1000);
  return options;
}

struct Finished {
  int code = -1;
  std::optional<FailureRecord> failure;
};

std::future<Finished> run_agent(AgentOptions options, std::shared_ptr<Store> store) {
  return std::async(std::launch::async, [options = std::move(options), store] {
    ElasticAgent agent(options, store);
    Finished f;
    f.code = agent.run();
    f.failure = agent.last_failure();
    return f;
  });
}

// The generation stored under `number`, once it exists (at most 30 s).
std::optional<Generation> generation(Store& store, int64_t number) {
  if (!wait_for([&] { return store.check({elastic::generation_key(number)}); }, seconds(30))) {
    return std::nullopt;
  }
  return Generation::decode(to_string(store.get(elastic::generation_key(number))));
}

std::vector<std::string> ids(const Generation& g) {
  std::vector<std::string> out;
  for (const auto& node : g.nodes) out.push_back(node.id);
  return out;
}

std::string lines_of(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Generation 0 waits the last call and holds both nodes; a worker failing on node b makes b's
// incarnation leave (generation 1 without it) and rejoin (generation 2), while node a's workers
// keep running untouched.
TEST(ElasticAgentTest, LocalFailure_NodeLeavesAndRejoinsWhileTheOtherKeepsItsWorkers) {
  const auto dir = hsgd::testing::unique_temp_dir("elastic_rejoin");
  const std::string fail_b =
      "case $HSGD_ELASTIC_NODE_ID in b-*-0) if [ $LOCAL_RANK = 1 ]; then "
      "for i in $(seq 6000); do [ -e " +
      dir.string() +
      "/fail_b ] && { echo failing on purpose >&2; exit 1; }; sleep 0.01; "
      "done; fi;; esac; ";
  auto store = std::make_shared<HashStore>();
  // MAX 3: two nodes never end the last call early, so b is in generation 0 only by waiting.
  auto a_options = elastic_job(worker_script(dir, fail_b), dir / "logs_a", "a", 1, 3);
  auto b_options = elastic_job(worker_script(dir, fail_b), dir / "logs_b", "b", 1, 3);
  b_options.max_restarts = 1;
  auto a = run_agent(a_options, store);
  std::this_thread::sleep_for(milliseconds(200));
  auto b = run_agent(b_options, store);

  const auto g0 = generation(*store, 0);
  ASSERT_TRUE(g0.has_value()) << "no generation 0 within 30 s";
  ASSERT_EQ(g0->nodes.size(), 2u) << g0->describe();
  const std::string a0 = g0->nodes[0].id, b0 = g0->nodes[1].id;
  EXPECT_TRUE(a0.starts_with("a-") && a0.ends_with("-0")) << a0;
  EXPECT_TRUE(b0.starts_with("b-") && b0.ends_with("-0")) << b0;
  EXPECT_EQ(g0->world_size(), 4);

  std::ofstream(dir / "fail_b") << "now\n";
  const auto g1 = generation(*store, 1);
  ASSERT_TRUE(g1.has_value()) << "no generation 1 within 30 s";
  EXPECT_EQ(ids(*g1), std::vector<std::string>{a0}) << g1->describe();
  EXPECT_TRUE(store->check({elastic::left_key(b0)}));
  const auto g2 = generation(*store, 2);
  ASSERT_TRUE(g2.has_value()) << "no generation 2 within 30 s";
  ASSERT_EQ(g2->nodes.size(), 2u) << g2->describe();
  EXPECT_EQ(g2->nodes[0].id, a0) << "the surviving node keeps node rank 0";
  const std::string b1 = g2->nodes[1].id;
  EXPECT_EQ(b1, b0.substr(0, b0.size() - 1) + "1");

  std::ofstream(dir / "finish") << "now\n";
  const Finished a_end = a.get(), b_end = b.get();
  EXPECT_EQ(a_end.code, 0);
  EXPECT_FALSE(a_end.failure.has_value()) << a_end.failure->message;
  EXPECT_EQ(b_end.code, 0);
  ASSERT_TRUE(b_end.failure.has_value());
  EXPECT_NE(b_end.failure->message.find("exit code 1"), std::string::npos)
      << b_end.failure->message;
  EXPECT_NE(b_end.failure->message.find("failing on purpose"), std::string::npos)
      << b_end.failure->message;
  EXPECT_TRUE(store->check({elastic::kFinishedKey}));
  EXPECT_FALSE(store->check({elastic::generation_key(3)})) << "no generation after the job ended";

  // Node a's workers ran once, as incarnation 0: one pid each, never restarted.
  for (int local = 0; local < 2; ++local) {
    const std::string pids = lines_of(dir / ("pid_" + a0 + "_" + std::to_string(local)));
    EXPECT_EQ(std::count(pids.begin(), pids.end(), '\n'), 1) << "local rank " << local << ":\n"
                                                             << pids;
  }
  EXPECT_EQ(count_files(dir, "pid_" + a0.substr(0, a0.size() - 1)), 2) << "a restarted";
  // Node b ran incarnations 0 and 1; incarnation 1's workers got their own variables.
  const std::string env = lines_of(dir / ("env_" + b1 + "_1"));
  for (const std::string& line :
       {"HSGD_ELASTIC_NODE_ID=" + b1, std::string("HSGD_ELASTIC_MIN_NODES=1"),
        std::string("HSGD_ELASTIC_MAX_NODES=3"), std::string("HSGD_ELASTIC_HEARTBEAT_MS=2000"),
        std::string("HSGD_RESTART_COUNT=1"), std::string("LOCAL_RANK=1"),
        std::string("LOCAL_WORLD_SIZE=2"), std::string("RANK=1"), std::string("WORLD_SIZE=2"),
        std::string("GROUP_RANK=0")}) {
    EXPECT_NE(env.find("\n" + line + "\n"), std::string::npos) << line << " missing in\n" << env;
  }
}

// An incarnation that registered and never beats (its agent died) is found silent, marked left,
// and the next generation goes on without it.
TEST(ElasticAgentTest, SilentIncarnation_IsMarkedLeftAndDropped) {
  const auto dir = hsgd::testing::unique_temp_dir("elastic_silent");
  auto store = std::make_shared<HashStore>();
  const elastic::MemberNode ghost{.id = "ghost-1-0", .host = "ghost", .local_world_size = 2};
  elastic::register_node(*store, ghost);
  auto options = elastic_job(worker_script(dir), dir / "logs", "a", 1, 2);
  auto a = run_agent(options, store);
  const auto g0 = generation(*store, 0);
  ASSERT_TRUE(g0.has_value());
  EXPECT_EQ(g0->nodes.size(), 2u) << "MAX nodes registered: no last call; " << g0->describe();
  EXPECT_EQ(g0->nodes[0].id, "ghost-1-0");
  const auto g1 = generation(*store, 1);
  ASSERT_TRUE(g1.has_value());
  ASSERT_EQ(g1->nodes.size(), 1u) << g1->describe();
  EXPECT_TRUE(g1->nodes[0].id.starts_with("a-")) << g1->describe();
  EXPECT_TRUE(store->check({elastic::left_key(ghost.id)}));
  std::ofstream(dir / "finish") << "now\n";
  EXPECT_EQ(a.get().code, 0);
}

// Fewer than MIN nodes for longer than rdzv_timeout: the job fails, the workers are stopped.
TEST(ElasticAgentTest, BelowMinForRdzvTimeout_ExitsOneNamingAliveAndMin) {
  const auto dir = hsgd::testing::unique_temp_dir("elastic_below_min");
  auto store = std::make_shared<HashStore>();
  auto options = elastic_job(worker_script(dir), dir / "logs", "a", 2, 3);
  options.rdzv_timeout = milliseconds(1000);
  const Finished end = run_agent(options, store).get();
  EXPECT_EQ(end.code, 1);
  ASSERT_TRUE(end.failure.has_value());
  EXPECT_NE(end.failure->message.find("only 1 node(s) alive, fewer than the minimum 2"),
            std::string::npos)
      << end.failure->message;
  EXPECT_FALSE(store->check({elastic::generation_key(0)}));
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.path().filename().string().starts_with("pid_")) continue;
    pid_t pid = 0;
    std::ifstream(e.path()) >> pid;
    ASSERT_GT(pid, 0);
    EXPECT_FALSE(process_exists(pid)) << e.path() << " survived";
  }
}

// A store whose server leaves requests unanswered while `silent` is set: check() throws the
// Timeout a TcpStore throws when no reply comes (a silent link; nothing was closed).
class SilentServerStore : public HashStore {
 public:
  std::atomic<bool> silent{false};
  bool check(const std::vector<std::string>& keys) override {
    if (silent.load()) throw Timeout("TcpStore 10.0.0.1:29400: check: no reply from the server");
    return HashStore::check(keys);
  }
};

// One agent (1..2 nodes) on a SilentServerStore with the given --rdzv-timeout, its generation 0
// formed and its 2 workers started.
struct SilentJob {
  fs::path dir;
  std::shared_ptr<SilentServerStore> store = std::make_shared<SilentServerStore>();
  std::future<Finished> end;
  std::optional<Generation> g0;

  SilentJob(const std::string& name, milliseconds rdzv_timeout)
      : dir(hsgd::testing::unique_temp_dir(name)) {
    auto options = elastic_job(worker_script(dir), dir / "logs", "a", 1, 2);
    options.rdzv_timeout = rdzv_timeout;
    end = run_agent(options, store);
    g0 = generation(*store, 0);
  }
  bool started() {
    return g0.has_value() && wait_for([&] { return count_files(dir, "env_") == 2; }, seconds(20));
  }
  ~SilentJob() { std::ofstream(dir / "finish") << "now\n"; }  // releases workers left behind
};

// A server that does not answer for a while: the agent keeps its workers and tries again; the
// job ends normally. Silent for longer than --rdzv-timeout, the store's Timeout ends run().
TEST(ElasticAgentTest, UnansweredStore_ShorterThanRdzvTimeout_IsRiddenOut) {
  SilentJob job("elastic_silent_store", milliseconds(5000));
  ASSERT_TRUE(job.started());
  job.store->silent = true;
  std::this_thread::sleep_for(milliseconds(1500));  // many monitor rounds
  job.store->silent = false;
  std::ofstream(job.dir / "finish") << "now\n";
  EXPECT_EQ(job.end.get().code, 0);
  const std::string pids = lines_of(job.dir / ("pid_" + ids(*job.g0)[0] + "_0"));
  EXPECT_EQ(std::count(pids.begin(), pids.end(), '\n'), 1) << "the worker was restarted:\n" << pids;
}

TEST(ElasticAgentTest, UnansweredStore_LongerThanRdzvTimeout_EndsRun) {
  SilentJob job("elastic_silent_store_long", milliseconds(1000));
  ASSERT_TRUE(job.started());
  job.store->silent = true;
  EXPECT_THROW(job.end.get(), Timeout);
}

// A stop request is forwarded to the workers; the node leaves and exits 128 + signal.
TEST(ElasticAgentTest, StopRequest_LeavesAndReturns128PlusSignal) {
  const auto dir = hsgd::testing::unique_temp_dir("elastic_stop");
  auto store = std::make_shared<HashStore>();
  auto options = elastic_job(worker_script(dir), dir / "logs", "a", 1, 2);
  ElasticAgent agent(options, store);
  auto code = std::async(std::launch::async, [&] { return agent.run(); });
  ASSERT_TRUE(wait_for([&] { return count_files(dir, "env_") == 2; }, seconds(20)));
  agent.request_stop(SIGTERM);
  EXPECT_EQ(code.get(), 128 + SIGTERM);
  const auto regs = elastic::read_registrations(*store);
  ASSERT_EQ(regs.size(), 1u);
  EXPECT_TRUE(regs[0].left);
}

// Workers that take SIGTERM as a preemption (a checkpoint, then exit 75): the node exits 75.
TEST(ElasticAgentTest, StopRequestAnsweredWithExit75_Returns75) {
  const auto dir = hsgd::testing::unique_temp_dir("elastic_preempted");
  auto store = std::make_shared<HashStore>();
  auto options = elastic_job("trap 'exit 75' TERM; " + worker_script(dir), dir / "logs", "a", 1, 2);
  ElasticAgent agent(options, store);
  auto code = std::async(std::launch::async, [&] { return agent.run(); });
  ASSERT_TRUE(wait_for([&] { return count_files(dir, "env_") == 2; }, seconds(20)));
  agent.request_stop(SIGTERM);
  EXPECT_EQ(code.get(), 75);
}

TEST(ElasticAgentTest, BadRange_IsRefusedNamingTheValues) {
  auto options = elastic_job("true", "", "a", 3, 2);
  try {
    ElasticAgent agent(options, std::make_shared<HashStore>());
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("min_nodes 3 and max_nodes 2"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace hsgd::comm::launcher
