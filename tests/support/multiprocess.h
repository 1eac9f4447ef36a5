#pragma once
// Runs the ranks of a multi-rank test, either as separate processes (fork) or as threads of this
// process, with a hard deadline. Shared by every multi-rank suite (comm, DDP, averaging).
//
// Processes: run_ranks() forks world_size children, each running body(rank). It must be called
// while the test process has no other threads (fork copies only the calling thread): create
// process groups, stores with threads etc. inside body, never before. A child fails when body
// throws, when a GoogleTest assertion failed inside it, or when it dies; its message goes back
// to the parent through a pipe. At the deadline every child still running is killed (SIGKILL,
// by pid). After a first failure the others get `failure_grace` to finish, then are killed, so
// a failing rank does not turn into a hang of its peers.
//
// Usage:
//   auto dir = hsgd::testing::unique_temp_dir("allreduce");
//   auto result = hsgd::testing::run_ranks(4, std::chrono::seconds(30), [&](int rank) {
//     auto store = std::make_shared<hsgd::comm::FileStore>(dir);
//     auto pg = hsgd::comm::init_process_group(
//         {.rank = rank, .world_size = 4, .store = store, .token = "test-token"});
//     std::vector<float> x{1.0f};
//     pg->allreduce(std::span<float>(x))->wait();
//     EXPECT_EQ(x[0], 4.0f);
//   });
//   EXPECT_RANKS_OK(result);

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace hsgd::testing {

struct RankFailure {
  int rank = 0;
  std::string reason = "";  // the exception message, "GoogleTest assertion failed", signal, timeout
};

struct RunResult {
  int world_size = 0;
  std::vector<RankFailure> failures = {};  // ordered by rank
  bool ok() const { return failures.empty(); }
  // "rank 2: Timeout: ...\nrank 3: killed after the 30000 ms deadline"
  std::string describe() const;
};

struct RunOptions {
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  // After the first failure the other ranks are killed once this has passed.
  std::chrono::milliseconds failure_grace = std::chrono::seconds(10);
};

RunResult run_ranks(int world_size, const RunOptions& options,
                    const std::function<void(int rank)>& body);
RunResult run_ranks(int world_size, std::chrono::milliseconds timeout,
                    const std::function<void(int rank)>& body);

// Same contract with one thread per rank in this process (share a HashStore between them).
// Threads cannot be killed: at the deadline the ranks still running are printed to stderr and
// the process aborts, so ctest reports the failure instead of hanging.
RunResult run_ranks_in_threads(int world_size, std::chrono::milliseconds timeout,
                               const std::function<void(int rank)>& body);

// A new empty directory under the system temp dir, unique to this process and call.
std::filesystem::path unique_temp_dir(const std::string& tag);

}  // namespace hsgd::testing

#define EXPECT_RANKS_OK(result) EXPECT_TRUE((result).ok()) << (result).describe()
#define ASSERT_RANKS_OK(result) ASSERT_TRUE((result).ok()) << (result).describe()
