// ElasticWorld (comm/elastic/elastic_world.h) with forked workers on emulated nodes: the test
// process or one of the workers plays the agent and writes the generation records
// (propose_generation). Collectives have a 20 s timeout: every failure the tests expect must
// come far sooner, from a lost connection, the watcher or ProcessGroup::abort.

#include "comm/elastic/elastic_world.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/error.h"
#include "comm/process_group/process_group.h"
#include "comm/store/file_store.h"
#include "tests/support/multiprocess.h"

namespace hsgd::comm::elastic {
namespace {

using Clock = std::chrono::steady_clock;
using hsgd::testing::run_ranks;
using hsgd::testing::RunOptions;
using hsgd::testing::unique_temp_dir;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Duration kCollectiveTimeout = seconds(20);

// A generation of nodes "<host>-1-0" with the given worker counts, in node-rank order.
Generation make_generation(int64_t number, const std::vector<std::pair<std::string, int>>& nodes) {
  Generation g{.number = number};
  for (const auto& [host, workers] : nodes) {
    g.nodes.push_back({.id = host + "-1-0", .host = host, .local_world_size = workers});
  }
  return g;
}

ElasticWorldOptions options_for(const std::filesystem::path& dir, const std::string& host,
                                int local_rank) {
  return {.node_id = host + "-1-0",
          .init = {.local_rank = local_rank,
                   .token = "test-token",
                   .timeout = kCollectiveTimeout},
          .store = std::make_shared<FileStore>(dir),
          .join_timeout = seconds(20),
          .poll_interval = milliseconds(10)};
}

// Sum of allreduce over values {1, ..., size} (rank r contributes r + 1).
float allreduce_rank_sum(ProcessGroup& world) {
  std::vector<float> x{static_cast<float>(world.rank() + 1)};
  world.allreduce(std::span<float>(x))->wait(world.work_timeout());
  return x[0];
}

float triangle(int n) { return static_cast<float>(n * (n + 1) / 2); }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

double ms_since(int64_t start_ns) { return static_cast<double>(now_ns() - start_ns) / 1e6; }

// Exits at once, as a host that vanished: no shutdown, no destructors. A GoogleTest failure
// before it still fails the rank.
[[noreturn]] void vanish() {
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(::testing::Test::HasFailure() ? 1 : 0);
}

// Waits for the collective, which must fail with hsgd::CommError; returns how long it took from
// start_ns (ms).
double expect_comm_error(const std::shared_ptr<Work>& work, const ProcessGroup& world,
                         int64_t start_ns, const std::string& what) {
  try {
    work->wait(world.work_timeout());
    ADD_FAILURE() << what << ": the collective should fail";
  } catch (const CommError& e) {
    std::printf("%s: failed after %.0f ms: %s\n", what.c_str(), ms_since(start_ns), e.what());
  }
  return ms_since(start_ns);
}

struct ProcessUsage {
  int fds = 0;
  int threads = 0;
  double rss_mb = 0;
};

int count_entries(const char* dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

ProcessUsage process_usage() {
  ProcessUsage usage{.fds = count_entries("/proc/self/fd"),
                     .threads = count_entries("/proc/self/task")};
  std::ifstream statm("/proc/self/statm");
  long pages = 0;
  long resident = 0;
  statm >> pages >> resident;
  usage.rss_mb = static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) /
                 (1024.0 * 1024.0);
  return usage;
}

// Two nodes of two workers; node b vanishes while a's ranks wait in an allreduce. The allreduce
// fails from the lost connections, long before the collective timeout, and a's workers go on
// in generation 1 without b.
TEST(ElasticWorldTest, LostNode_FailsCollectiveAndSurvivorsAdvance) {
  const auto dir = unique_temp_dir("elastic_lost");
  {
    FileStore store(dir);
    propose_generation(store, make_generation(0, {{"a", 2}, {"b", 2}}));
  }
  auto result = run_ranks(4, RunOptions{.timeout = seconds(90)}, [&](int rank) {
    const std::string host = rank < 2 ? "a" : "b";
    const int local_rank = rank % 2;
    ElasticWorld elastic(options_for(dir, host, local_rank));
    Store& store = elastic.store();
    std::shared_ptr<ProcessGroup> world = elastic.advance();
    ASSERT_EQ(elastic.generation().number, 0);
    EXPECT_EQ(world->size(), 4);
    EXPECT_EQ(world->rank(), rank) << "node " << host << " local rank " << local_rank;
    EXPECT_EQ(elastic.node_rank(), rank / 2);
    // Two nodes on one machine: the world stays on the network, each node's pair shares memory.
    EXPECT_FALSE(world->uses_shared_memory());
    EXPECT_TRUE(world->uses_two_level_allreduce());
    EXPECT_EQ(allreduce_rank_sum(*world), triangle(4));

    if (host == "b") {
      store.wait({"a-entered/0", "a-entered/1"}, seconds(30));
      vanish();
    }
    // Large enough that a's ranks still write to b after b's sockets closed (a write to a closed
    // connection must fail the collective, not raise SIGPIPE in the survivor).
    std::vector<float> x(size_t{1} << 22, 1.0f);
    auto work = world->allreduce(std::span<float>(x));
    const int64_t start = now_ns();
    store.set("a-entered/" + std::to_string(local_rank), to_bytes("1"));
    const double failed_ms = expect_comm_error(work, *world, start, "rank " + std::to_string(rank));
    EXPECT_LT(failed_ms, 15000.0) << "far below the " << kCollectiveTimeout.count()
                                  << " ms collective timeout";

    if (local_rank == 0) propose_generation(store, make_generation(1, {{"a", 2}}));
    world.reset();
    world = elastic.advance();
    ASSERT_EQ(elastic.generation().number, 1);
    EXPECT_EQ(world->size(), 2);
    EXPECT_EQ(world->rank(), local_rank);
    EXPECT_TRUE(world->uses_shared_memory()) << "generation 1 is one node";
    EXPECT_EQ(allreduce_rank_sum(*world), triangle(2));
    world->shutdown(kCollectiveTimeout);
  });
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

// Node b's worker stops (SIGSTOP: its sockets stay open, as when a host hangs) while a's ranks
// wait in an allreduce. Nothing fails on the network; the agent's generation 1 without b makes
// the watcher abort the world, so the allreduce fails within moments of the proposal.
TEST(ElasticWorldTest, Watcher_AbortsWorldWhenNewerGenerationDropsMember) {
  const auto dir = unique_temp_dir("elastic_watcher");
  {
    FileStore store(dir);
    propose_generation(store, make_generation(0, {{"a", 2}, {"b", 1}}));
  }
  auto result = run_ranks(3, RunOptions{.timeout = seconds(90)}, [&](int rank) {
    const std::string host = rank < 2 ? "a" : "b";
    const int local_rank = rank < 2 ? rank : 0;
    ElasticWorld elastic(options_for(dir, host, local_rank));
    Store& store = elastic.store();
    std::shared_ptr<ProcessGroup> world = elastic.advance();
    ASSERT_EQ(world->size(), 3);
    EXPECT_EQ(allreduce_rank_sum(*world), triangle(3));

    if (host == "b") {
      store.set("b-pid", to_bytes(std::to_string(::getpid())));
      ::raise(SIGSTOP);  // killed by a's local rank 0 at the end
      ADD_FAILURE() << "node b's worker should have been killed while stopped";
      return;
    }
    std::vector<float> x(1000, 1.0f);
    auto work = world->allreduce(std::span<float>(x));
    store.set("a-entered/" + std::to_string(local_rank), to_bytes("1"));
    if (local_rank == 0) {
      store.wait({"a-entered/1", "b-pid"}, seconds(30));
      std::this_thread::sleep_for(milliseconds(300));  // both of a's ranks wait for b
      store.set("proposed-at", to_bytes(std::to_string(now_ns())));
      propose_generation(store, make_generation(1, {{"a", 2}}));
    }
    const int64_t proposed_at = std::stoll(to_string(store.get("proposed-at", seconds(30))));
    const double latency_ms =
        expect_comm_error(work, *world, proposed_at, "rank " + std::to_string(rank));
    EXPECT_LT(latency_ms, 5000.0) << "the watcher should abort the world soon after the proposal";

    world.reset();
    world = elastic.advance();
    ASSERT_EQ(elastic.generation().number, 1);
    EXPECT_EQ(world->size(), 2);
    EXPECT_EQ(allreduce_rank_sum(*world), triangle(2));
    world->shutdown(kCollectiveTimeout);
    if (local_rank == 0) {
      const pid_t b = static_cast<pid_t>(std::stol(to_string(store.get("b-pid", seconds(5)))));
      EXPECT_EQ(::kill(b, SIGKILL), 0);
    }
  });
  ASSERT_EQ(result.failures.size(), 1u) << result.describe();
  EXPECT_EQ(result.failures[0].rank, 2);
  EXPECT_NE(result.failures[0].reason.find("killed by signal"), std::string::npos)
      << result.failures[0].reason;
  std::filesystem::remove_all(dir);
}

// Node c registers after generation 0 = {a, b} formed. Generation 1 = {a, b, c} only adds a
// node: the watcher leaves the world of generation 0 working, newer_generation_announced()
// tells a and b, which abandon it and form the world of 3 with c.
TEST(ElasticWorldTest, Joiner_IsAdoptedAtNextAdvance) {
  const auto dir = unique_temp_dir("elastic_joiner");
  {
    FileStore store(dir);
    propose_generation(store, make_generation(0, {{"a", 1}, {"b", 1}}));
  }
  auto result = run_ranks(3, RunOptions{.timeout = seconds(90)}, [&](int rank) {
    const std::string host = rank == 0 ? "a" : rank == 1 ? "b" : "c";
    ElasticWorld elastic(options_for(dir, host, 0));
    Store& store = elastic.store();
    std::shared_ptr<ProcessGroup> world;
    if (host == "c") {
      store.wait({"formed/0", "formed/1"}, seconds(30));
      register_node(store, {.id = elastic.node_id(), .host = "c", .local_world_size = 1});
      propose_generation(store, make_generation(1, {{"a", 1}, {"b", 1}, {"c", 1}}));
    } else {
      world = elastic.advance();
      ASSERT_EQ(world->size(), 2);
      EXPECT_EQ(allreduce_rank_sum(*world), triangle(2));
      EXPECT_FALSE(elastic.newer_generation_announced());
      store.set("formed/" + std::to_string(rank), to_bytes("1"));
      const auto deadline = Clock::now() + seconds(30);
      while (!elastic.newer_generation_announced() && Clock::now() < deadline) {
        std::this_thread::sleep_for(milliseconds(10));
      }
      ASSERT_TRUE(elastic.newer_generation_announced());
      // Several watcher periods: a generation that only adds nodes must not abort this world.
      std::this_thread::sleep_for(milliseconds(300));
      EXPECT_EQ(allreduce_rank_sum(*world), triangle(2));
      world.reset();
      elastic.abandon();
    }
    world = elastic.advance();
    ASSERT_EQ(elastic.generation().number, 1);
    EXPECT_EQ(world->size(), 3);
    EXPECT_EQ(world->rank(), rank);
    EXPECT_EQ(allreduce_rank_sum(*world), triangle(3));
    world->shutdown(kCollectiveTimeout);
  });
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

// 200 generations in the same two processes. In each, rank 1 waits in an allreduce that rank 0
// never joins and rank 0 aborts and abandons the world: rank 1's collective fails at once.
// Descriptors, threads and memory stay flat from generation 10 to 200. one_node: both ranks are
// the workers of one node (the world's allreduce runs in shared memory: a segment per
// generation); else two single-worker nodes (TCP).
void check_many_generations(bool one_node) {
  constexpr int kGenerations = 200;
  constexpr int kWarmup = 10;
  const auto dir = unique_temp_dir("elastic_teardown");
  const std::vector<std::pair<std::string, int>> nodes =
      one_node ? std::vector<std::pair<std::string, int>>{{"a", 2}}
               : std::vector<std::pair<std::string, int>>{{"a", 1}, {"b", 1}};
  auto result = run_ranks(2, RunOptions{.timeout = seconds(150)}, [&](int rank) {
    const std::string host = one_node || rank == 0 ? "a" : "b";
    ElasticWorld elastic(options_for(dir, host, one_node ? rank : 0));
    Store& store = elastic.store();
    ProcessUsage warm;
    double max_failure_ms = 0;
    const auto start = Clock::now();
    for (int g = 0; g < kGenerations; ++g) {
      propose_generation(store, make_generation(g, nodes));
      std::shared_ptr<ProcessGroup> world = elastic.advance();
      ASSERT_EQ(elastic.generation().number, g);
      ASSERT_EQ(world->rank(), rank);
      ASSERT_EQ(world->uses_shared_memory(), one_node) << "generation " << g;
      ASSERT_EQ(allreduce_rank_sum(*world), triangle(2)) << "generation " << g;
      const std::string entered = "entered/" + std::to_string(g);
      if (rank == 1) {
        std::vector<float> x(16, 1.0f);
        auto work = world->allreduce(std::span<float>(x));
        const int64_t begin = now_ns();
        store.set(entered, to_bytes("1"));
        try {
          work->wait(world->work_timeout());
          ADD_FAILURE() << "generation " << g << ": the allreduce rank 0 abandoned should fail";
          return;
        } catch (const CommError&) {
        }
        const double failed_ms = ms_since(begin);
        max_failure_ms = std::max(max_failure_ms, failed_ms);
        ASSERT_LT(failed_ms, 5000.0) << "generation " << g << ": far below the "
                                     << kCollectiveTimeout.count() << " ms collective timeout";
      } else {
        store.wait({entered}, seconds(30));
        // Aborted, not left together: rank 1 waits in a collective this rank never joins.
        world->abort();
        elastic.abandon();
      }
      world.reset();
      elastic.abandon();
      if (g + 1 == kWarmup) warm = process_usage();
    }
    const ProcessUsage end = process_usage();
    std::printf(
        "%s, rank %d: %d generations in %.1f s; slowest abandoned allreduce (rank 1) %.0f ms; "
        "after "
        "generation %d: %d fds, %d threads, %.1f MB RSS; after %d: %d fds, %d threads, %.1f MB "
        "RSS\n",
        one_node ? "one node" : "two nodes", rank, kGenerations,
        std::chrono::duration<double>(Clock::now() - start).count(), max_failure_ms, kWarmup,
        warm.fds, warm.threads, warm.rss_mb, kGenerations, end.fds, end.threads, end.rss_mb);
    EXPECT_LE(end.fds, warm.fds + 2);
    EXPECT_LE(end.threads, warm.threads + 2);
    EXPECT_LT(end.rss_mb - warm.rss_mb, 30.0);
  });
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

TEST(ElasticWorldTest, ManyGenerations_TeardownIsBoundedAndLeaksNothing) {
  check_many_generations(/*one_node=*/false);
}

TEST(ElasticWorldTest, ManyGenerationsOneNode_SharedMemoryTeardownLeaksNothing) {
  check_many_generations(/*one_node=*/true);
}

// ProcessGroup::abort reaches the groups made from the aborted one: rank 1 waits in an
// allreduce of a child group that rank 0 never joins; rank 0 aborts the world (not the child);
// rank 1's child allreduce fails at once, and rank 0's groups refuse work. Over Gloo's TCP (the
// elastic world's transport) and over shared memory (every rank on this machine).
class ProcessGroupAbortTest : public ::testing::TestWithParam<bool> {};

TEST_P(ProcessGroupAbortTest, AbortReachesChildGroups) {
  const auto dir = unique_temp_dir("abort_children");
  auto result = run_ranks(3, RunOptions{.timeout = seconds(60)}, [&](int rank) {
    auto store = std::make_shared<FileStore>(dir);
    auto world = init_process_group({.rank = rank,
                                     .world_size = 3,
                                     .store = store,
                                     .token = "test-token",
                                     .timeout = kCollectiveTimeout,
                                     .shared_memory = GetParam()});
    auto child = new_group(world, {0, 1});
    auto grandchild = child != nullptr ? new_group(child, {0, 1}) : nullptr;
    if (rank == 2) return;
    ASSERT_NE(grandchild, nullptr);
    EXPECT_EQ(allreduce_rank_sum(*grandchild), triangle(2));
    if (rank == 1) {
      std::vector<float> x(16, 1.0f);
      auto work = child->allreduce(std::span<float>(x));
      store->set("entered", to_bytes("1"));
      const int64_t aborted_at = std::stoll(to_string(store->get("aborted-at", seconds(30))));
      const double latency_ms = expect_comm_error(work, *child, aborted_at, "child of rank 1");
      EXPECT_LT(latency_ms, 1500.0);
      store->set("checked", to_bytes("1"));
      return;
    }
    store->wait({"entered"}, seconds(30));
    std::this_thread::sleep_for(milliseconds(200));  // rank 1 waits in the child allreduce
    store->set("aborted-at", to_bytes(std::to_string(now_ns())));
    world->abort();
    for (const auto& group : {world, child, grandchild}) {
      std::vector<float> x(16, 1.0f);
      const int64_t begin = now_ns();
      const double ms = expect_comm_error(group->allreduce(std::span<float>(x)), *group, begin,
                                          "rank 0 after abort, group " + group->name());
      EXPECT_LT(ms, 1500.0) << group->name();
    }
    // Alive until rank 1 failed: a peer that exited is found by other means.
    store->wait({"checked"}, seconds(40));
  });
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Transports, ProcessGroupAbortTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "SharedMemory" : "Tcp"; });

// abandon() of a world that has not failed waits for the other members to leave too; when one
// of them hangs (SIGSTOP), the agent's generation without it ends that wait through the watcher,
// long before leave_timeout.
TEST(ElasticWorldTest, Abandon_LeaveEndsWhenNewerGenerationDropsMember) {
  const auto dir = unique_temp_dir("elastic_leave");
  {
    FileStore store(dir);
    propose_generation(store, make_generation(0, {{"a", 1}, {"b", 1}}));
  }
  auto result = run_ranks(2, RunOptions{.timeout = seconds(60)}, [&](int rank) {
    ElasticWorldOptions options = options_for(dir, rank == 0 ? "a" : "b", 0);
    options.leave_timeout = seconds(20);
    ElasticWorld elastic(std::move(options));
    Store& store = elastic.store();
    std::shared_ptr<ProcessGroup> world = elastic.advance();
    EXPECT_EQ(allreduce_rank_sum(*world), triangle(2));
    if (rank == 1) {
      store.set("b-pid", to_bytes(std::to_string(::getpid())));
      ::raise(SIGSTOP);  // killed by rank 0 at the end
      ADD_FAILURE() << "node b's worker should have been killed while stopped";
      return;
    }
    store.wait({"b-pid"}, seconds(30));
    world.reset();
    std::thread agent([&] {
      std::this_thread::sleep_for(milliseconds(500));
      propose_generation(store, make_generation(1, {{"a", 1}}));
    });
    const int64_t start = now_ns();
    elastic.abandon();
    const double ms = ms_since(start);
    agent.join();
    std::printf("abandon with a stopped member returned after %.0f ms\n", ms);
    EXPECT_LT(ms, 5000.0) << "the watcher should end the leave; leave_timeout is 20 s";
    world = elastic.advance();
    EXPECT_EQ(elastic.generation().number, 1);
    EXPECT_EQ(world->size(), 1);
    const pid_t b = static_cast<pid_t>(std::stol(to_string(store.get("b-pid", seconds(5)))));
    EXPECT_EQ(::kill(b, SIGKILL), 0);
  });
  ASSERT_EQ(result.failures.size(), 1u) << result.describe();
  EXPECT_EQ(result.failures[0].rank, 1);
  EXPECT_NE(result.failures[0].reason.find("killed by signal"), std::string::npos)
      << result.failures[0].reason;
  std::filesystem::remove_all(dir);
}

// No group can be made from an aborted group (one aborted while its child connects, e.g. by
// the elastic watcher, aborts the child): new_group throws instead of connecting.
TEST(ProcessGroupAbortChildTest, NewGroupOfAbortedGroupThrows) {
  const auto dir = unique_temp_dir("abort_late_child");
  auto result = run_ranks(2, RunOptions{.timeout = seconds(60)}, [&](int rank) {
    auto store = std::make_shared<FileStore>(dir);
    auto world = init_process_group({.rank = rank,
                                     .world_size = 2,
                                     .store = store,
                                     .token = "test-token",
                                     .timeout = kCollectiveTimeout,
                                     .shared_memory = false});
    EXPECT_EQ(allreduce_rank_sum(*world), triangle(2));
    // Neither rank aborts before the other finished the allreduce.
    store->set("done/" + std::to_string(rank), to_bytes("1"));
    store->wait({"done/0", "done/1"}, seconds(30));
    world->abort();
    EXPECT_TRUE(world->failed());
    try {
      new_group(world, {0, 1});
      ADD_FAILURE() << "new_group of an aborted group should throw";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
    }
  });
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

// The ranks agree on a collective (the training loop's join vote) and abandon the world at once:
// the first to abandon must not take the tail of that collective from a slower one (abandon
// leaves a world that has not failed together before aborting it). 30 generations in a row.
TEST(ElasticWorldTest, AbandonAfterAgreement_SlowerMemberCompletes) {
  constexpr int kGenerations = 30;
  const auto dir = unique_temp_dir("elastic_agree");
  auto result = run_ranks(3, RunOptions{.timeout = seconds(90)}, [&](int rank) {
    const std::string host = rank == 0 ? "a" : rank == 1 ? "b" : "c";
    ElasticWorld elastic(options_for(dir, host, 0));
    for (int g = 0; g < kGenerations; ++g) {
      propose_generation(elastic.store(), make_generation(g, {{"a", 1}, {"b", 1}, {"c", 1}}));
      std::shared_ptr<ProcessGroup> world = elastic.advance();
      ASSERT_EQ(elastic.generation().number, g);
      std::vector<float> vote(size_t{1} << 16, static_cast<float>(rank));
      world->allreduce(std::span<float>(vote), ReduceOp::kMax, "vote")->wait(world->work_timeout());
      ASSERT_EQ(vote.back(), 2.0f) << "generation " << g;
      world.reset();
      elastic.abandon();
    }
  });
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace hsgd::comm::elastic
