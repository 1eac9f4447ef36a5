// Allreduce over shared memory (comm/process_group/shm_allreduce.h) in separate processes: chunk
// boundaries, agreement with Gloo's TCP path, which groups use it, a peer that exits mid-job, and
// that no segment is left in /dev/shm.

#include "comm/process_group/shm_allreduce.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "comm/error.h"
#include "comm/process_group/process_group.h"
#include "comm/store/file_store.h"
#include "tests/support/error_message.h"
#include "tests/support/multiprocess.h"
#include "tests/support/world.h"

namespace hsgd::comm {
namespace {

using hsgd::testing::error_message;
using hsgd::testing::run_ranks;
using hsgd::testing::run_world;
using hsgd::testing::unique_temp_dir;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// Non-integer inputs, so that the sum depends on rounding: the shared-memory and TCP results are
// compared with each other at a tolerance, and each rank's result with every other's bitwise.
template <typename T>
std::vector<T> inputs(int rank, size_t n) {
  std::vector<T> x(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = static_cast<T>(0.1 * static_cast<double>(rank + 1) * static_cast<double>(i % 13) -
                          0.37 * static_cast<double>(rank));
  }
  return x;
}

// Sizes around the chunk (one rank's slot) and its per-rank shares: a chunk split in shares of
// whole cache lines leaves the last ranks with short or empty shares.
template <typename T>
std::vector<size_t> chunk_edge_sizes() {
  const size_t chunk = ShmAllreduce::kChunkBytes / sizeof(T);
  return {1, 15, 17, 129, chunk - 1, chunk, chunk + 1, 3 * chunk + 5};
}

template <typename T>
void compare_with_tcp(ProcessGroup& shm, ProcessGroup& tcp, FileStore& store, int world) {
  for (size_t n : chunk_edge_sizes<T>()) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
      auto a = inputs<T>(shm.rank(), n);
      auto b = a;
      shm.allreduce(std::span<T>(a), op)->wait();
      tcp.allreduce(std::span<T>(b), op)->wait();
      for (size_t i = 0; i < n; ++i) {
        const double tolerance = 1e-5 * (1.0 + std::abs(static_cast<double>(b[i])));
        if (std::abs(static_cast<double>(a[i] - b[i])) > tolerance) {
          ADD_FAILURE() << to_string(op) << " n=" << n << " world=" << world << " index " << i
                        << ": shared memory " << a[i] << ", TCP " << b[i];
          return;
        }
      }
      // Every rank must hold the same bits: publish a checksum of them and compare.
      uint64_t hash = 1469598103934665603ull;
      const auto* bytes = reinterpret_cast<const unsigned char*>(a.data());
      for (size_t i = 0; i < n * sizeof(T); ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
      const std::string key =
          "hash/" + std::to_string(sizeof(T)) + "/" + std::to_string(n) + "/" + to_string(op) + "/";
      store.set(key + std::to_string(shm.rank()), to_bytes(std::to_string(hash)));
      const auto first = to_string(store.get(key + "0", std::chrono::seconds(30)));
      EXPECT_EQ(std::to_string(hash), first) << key << " rank " << shm.rank();
    }
  }
}

TEST(ShmAllreduceTest, MatchesTcpAcrossChunkEdges_SameBitsOnEveryRank) {
  for (int world : {2, 3, 5}) {
    const auto dir = unique_temp_dir("shm_edges");
    auto result = run_ranks(world, std::chrono::seconds(120), [&](int rank) {
      auto store = std::make_shared<FileStore>(dir);
      auto shm = init_process_group({.rank = rank,
                                     .world_size = world,
                                     .store = store,
                                     .key_prefix = "shm/",
                                     .token = "test-token",
                                     .timeout = std::chrono::seconds(30)});
      auto tcp = init_process_group({.rank = rank,
                                     .world_size = world,
                                     .store = store,
                                     .key_prefix = "tcp/",
                                     .token = "test-token",
                                     .timeout = std::chrono::seconds(30),
                                     .shared_memory = false});
      ASSERT_TRUE(shm->uses_shared_memory());
      ASSERT_FALSE(tcp->uses_shared_memory());
      compare_with_tcp<float>(*shm, *tcp, *store, world);
      compare_with_tcp<double>(*shm, *tcp, *store, world);
      shm->shutdown(std::chrono::seconds(30));
      tcp->shutdown(std::chrono::seconds(30));
    });
    EXPECT_RANKS_OK(result) << "world " << world;
    std::filesystem::remove_all(dir);
  }
}

TEST(ShmAllreduceTest, SubgroupsOfOneNodeUseItAndInheritTheSwitch) {
  const auto dir = unique_temp_dir("shm_subgroups");
  auto result = run_ranks(4, std::chrono::seconds(60), [&](int rank) {
    auto store = std::make_shared<FileStore>(dir);
    auto world =
        init_process_group({.rank = rank, .world_size = 4, .store = store, .token = "test-token"});
    auto [pair, pairs] = new_subgroups(world, 2);
    ASSERT_TRUE(pair->uses_shared_memory());
    std::vector<float> x{static_cast<float>(rank)};
    pair->allreduce(std::span<float>(x))->wait();
    EXPECT_EQ(x[0], rank < 2 ? 1.0f : 5.0f);
    auto off = init_process_group({.rank = rank,
                                   .world_size = 4,
                                   .store = store,
                                   .key_prefix = "off/",
                                   .token = "test-token",
                                   .shared_memory = false});
    auto [off_pair, off_pairs] = new_subgroups(off, 2);
    EXPECT_FALSE(off_pair->uses_shared_memory());
    world->shutdown(std::chrono::seconds(30));
    off->shutdown(std::chrono::seconds(30));
  });
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

// Two launcher agents on one machine emulate two nodes (GROUP_RANK differs): traffic between
// them stays on the network, where a rate limit between the emulated nodes applies.
TEST(ShmAllreduceTest, RanksOfDifferentNodesNeverShareOneSegment) {
  const auto dir = unique_temp_dir("shm_nodes");
  auto result = run_ranks(4, std::chrono::seconds(60), [&](int rank) {
    ::setenv("GROUP_RANK", std::to_string(rank / 2).c_str(), 1);
    auto world = init_process_group({.rank = rank,
                                     .world_size = 4,
                                     .store = std::make_shared<FileStore>(dir),
                                     .token = "test-token"});
    EXPECT_FALSE(world->uses_shared_memory());
    EXPECT_TRUE(world->uses_two_level_allreduce());
    auto [node, nodes] = new_subgroups(world, 2);
    EXPECT_TRUE(node->uses_shared_memory());  // both members on the same emulated node
    std::vector<double> x{static_cast<double>(rank)};
    world->allreduce(std::span<double>(x))->wait();
    EXPECT_EQ(x[0], 6.0);
    world->shutdown(std::chrono::seconds(30));
  });
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

// Groups spanning emulated nodes (GROUP_RANK) allreduce in two levels when every node has the
// same number >= 2 of members, contiguous or interleaved; otherwise over TCP alone. Either way
// the result matches Gloo's TCP path and is the same on every rank.
TEST(ShmAllreduceTest, TwoLevelAcrossNodesMatchesTcp) {
  struct Layout {
    int world;
    int (*node_of)(int rank);
    bool two_level;
  };
  const Layout layouts[] = {
      {4, [](int r) { return r / 2; }, true},           // 2 nodes x 2
      {6, [](int r) { return r / 3; }, true},           // 2 nodes x 3
      {6, [](int r) { return r % 3; }, true},           // 3 nodes x 2, ranks interleaved
      {4, [](int r) { return r == 0 ? 0 : 1; }, false}  // 1 + 3: not uniform
  };
  for (const Layout& layout : layouts) {
    const auto dir = unique_temp_dir("shm_two_level");
    auto result = run_ranks(layout.world, std::chrono::seconds(120), [&](int rank) {
      ::setenv("GROUP_RANK", std::to_string(layout.node_of(rank)).c_str(), 1);
      auto store = std::make_shared<FileStore>(dir);
      auto two = init_process_group({.rank = rank,
                                     .world_size = layout.world,
                                     .store = store,
                                     .key_prefix = "two/",
                                     .token = "test-token",
                                     .timeout = std::chrono::seconds(30)});
      auto tcp = init_process_group({.rank = rank,
                                     .world_size = layout.world,
                                     .store = store,
                                     .key_prefix = "tcp/",
                                     .token = "test-token",
                                     .timeout = std::chrono::seconds(30),
                                     .shared_memory = false});
      ASSERT_FALSE(two->uses_shared_memory());
      ASSERT_EQ(two->uses_two_level_allreduce(), layout.two_level);
      ASSERT_FALSE(tcp->uses_two_level_allreduce());
      compare_with_tcp<float>(*two, *tcp, *store, layout.world);
      compare_with_tcp<double>(*two, *tcp, *store, layout.world);
      two->shutdown(std::chrono::seconds(30));
      tcp->shutdown(std::chrono::seconds(30));
    });
    EXPECT_RANKS_OK(result) << "world " << layout.world << ", two-level " << layout.two_level;
    std::filesystem::remove_all(dir);
  }
}

TEST(ShmAllreduceTest, PeerThatExitedIsNamedLongBeforeTheTimeout) {
  const auto dir = unique_temp_dir("shm_dead");
  constexpr auto kTimeout = std::chrono::seconds(60);
  hsgd::testing::RunOptions options;
  options.timeout = std::chrono::seconds(60);
  auto result = run_ranks(3, options, [&](int rank) {
    auto store = std::make_shared<FileStore>(dir);
    auto pg = init_process_group({.rank = rank,
                                  .world_size = 3,
                                  .store = store,
                                  .token = "test-token",
                                  .timeout = kTimeout});
    ASSERT_TRUE(pg->uses_shared_memory());
    std::vector<float> x(1000, 1.0f);
    pg->allreduce(std::span<float>(x))->wait();
    if (rank == 1) ::_exit(0);  // gone without a word, as after a crash
    const auto start = Clock::now();
    const std::string message =
        error_message<CommError>([&] { pg->allreduce(std::span<float>(x))->wait(); });
    EXPECT_THAT(message, HasSubstr("rank 1 (pid"));
    EXPECT_THAT(message, HasSubstr("exited"));
    EXPECT_THAT(message, HasSubstr("allreduce (1000 x float, sum) #1"));
    // Detection takes ~100 ms, the failure report's grace period after a lost peer 2 s (not
    // the 30 s it waits after a timeout, when the others are about as late).
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
  });
  // Rank 1's _exit(0) skips GoogleTest's bookkeeping but is a clean exit.
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

// Gloo would time out or mix data; here every rank learns which rank passed what, nothing is
// changed, and the next (matching) collective works.
TEST(ShmAllreduceTest, MismatchedCallsAreNamedOnEveryRank_GroupStaysUsable) {
  auto result = run_world(3, [&](int rank, const auto& pg) {
    ASSERT_TRUE(pg->uses_shared_memory());
    std::vector<float> x(rank == 1 ? 999 : 1000, 2.0f);
    std::string message =
        error_message([&] { pg->allreduce(std::span<float>(x), ReduceOp::kSum)->wait(); });
    EXPECT_THAT(message, HasSubstr("rank 1 with (999 x float, sum)")) << "rank " << rank;
    EXPECT_EQ(x[0], 2.0f);
    std::vector<double> y(10, 1.0);
    message = error_message([&] {
      pg->allreduce(std::span<double>(y), rank == 2 ? ReduceOp::kMax : ReduceOp::kSum)->wait();
    });
    EXPECT_THAT(message, HasSubstr("rank 2 with (10 x double, max)")) << "rank " << rank;
    pg->allreduce(std::span<double>(y), ReduceOp::kSum)->wait();
    EXPECT_EQ(y[9], 3.0);
    pg->shutdown(std::chrono::seconds(30));
  });
  EXPECT_RANKS_OK(result);
}

TEST(ShmAllreduceTest, NoSegmentIsLeftInDevShm) {
  auto result = run_world(3, [&](int rank, const auto& pg) {
    ASSERT_TRUE(pg->uses_shared_memory());
    std::vector<float> x(10, 1.0f);
    pg->allreduce(std::span<float>(x))->wait();
    EXPECT_EQ(x[0], 3.0f);
    if (rank == 0) {
      // Rank 0 created every segment (of the world); it is mapped but no longer has a name.
      const std::string own = "hsgd-" + std::to_string(::getpid()) + "-";
      for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
        EXPECT_NE(entry.path().filename().string().rfind(own, 0), 0u) << entry.path();
      }
    }
    pg->shutdown(std::chrono::seconds(30));
  });
  EXPECT_RANKS_OK(result);
}

TEST(ShmAllreduceTest, EnvironmentSwitchIsChecked) {
  ::setenv("HSGD_SHM", "0", 1);
  EXPECT_FALSE(InitOptions::from_env().shared_memory);
  ::setenv("HSGD_SHM", "1", 1);
  EXPECT_TRUE(InitOptions::from_env().shared_memory);
  ::setenv("HSGD_SHM", "yes", 1);
  const std::string message = error_message([] { InitOptions::from_env(); });
  EXPECT_THAT(message, HasSubstr("HSGD_SHM='yes'"));
  EXPECT_THAT(message, HasSubstr("must be 0"));
  ::unsetenv("HSGD_SHM");
  EXPECT_TRUE(InitOptions::from_env().shared_memory);
}

}  // namespace
}  // namespace hsgd::comm
