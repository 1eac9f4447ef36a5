// The two-level allreduce at a size above one node's shared-memory limit: 72 ranks in 9 emulated
// nodes of 8 (GROUP_RANK differs per block of 8). The world group must take the two-level path,
// and its results must be the exact sums wherever float32 sums are exact, on every rank.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "comm/process_group/process_group.h"
#include "comm/process_group/shm_allreduce.h"
#include "comm/store/file_store.h"
#include "tests/support/multiprocess.h"

namespace hsgd::comm {
namespace {

using hsgd::testing::run_ranks;
using hsgd::testing::unique_temp_dir;

constexpr int kNodes = 9;
constexpr int kPerNode = 8;
constexpr int kWorld = kNodes * kPerNode;

// Rank r's value i: small integers, so that every float32 sum of them is exact in any order.
float integer_input(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((static_cast<size_t>(rank) * 31 + i * 7) % 17) - 8);
}

float real_input(int rank, size_t i) {
  return std::sin(0.37f * static_cast<float>(rank) + 0.011f * static_cast<float>(i));
}

TEST(TwoLevelManyRanksTest, WorldOfSeventyTwoRanksInNineNodesTakesTheTwoLevelPath) {
  static_assert(kWorld > ShmAllreduce::kMaxRanks, "the group must exceed one node's limit");
  const auto dir = unique_temp_dir("two_level_many");
  hsgd::testing::RunOptions options;
  options.timeout = std::chrono::seconds(240);
  auto result = run_ranks(kWorld, options, [&](int rank) {
    ::setenv("GROUP_RANK", std::to_string(rank / kPerNode).c_str(), 1);
    auto world = init_process_group({.rank = rank,
                                     .world_size = kWorld,
                                     .store = std::make_shared<FileStore>(dir),
                                     .token = "test-token",
                                     .timeout = std::chrono::seconds(180)});
    ASSERT_FALSE(world->uses_shared_memory());
    ASSERT_TRUE(world->uses_two_level_allreduce());
    // Sizes below, at and above the number of shards (8), uneven shards, and a large buffer.
    for (const size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{1001}, size_t{65536 + 3}}) {
      std::vector<float> sum(n, 0.0f), largest(n, -INFINITY);
      std::vector<double> real_sum(n, 0.0);
      for (int r = 0; r < kWorld; ++r) {
        for (size_t i = 0; i < n; ++i) {
          sum[i] += integer_input(r, i);
          largest[i] = std::max(largest[i], integer_input(r, i));
          real_sum[i] += real_input(r, i);
        }
      }
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        std::vector<float> x(n);
        for (size_t i = 0; i < n; ++i) x[i] = integer_input(rank, i);
        world->allreduce(std::span<float>(x), op)->wait();
        for (size_t i = 0; i < n; ++i) {
          const float expected = op == ReduceOp::kMax   ? largest[i]
                                 : op == ReduceOp::kAvg ? sum[i] / static_cast<float>(kWorld)
                                                        : sum[i];
          if (std::memcmp(&x[i], &expected, sizeof(float)) != 0) {
            ADD_FAILURE() << to_string(op) << " n=" << n << " index " << i << ": got " << x[i]
                          << ", expected " << expected << " (rank " << rank << ")";
            return;
          }
        }
      }
      // Sums that round: within float tolerance of the double-precision sum.
      std::vector<float> y(n);
      for (size_t i = 0; i < n; ++i) y[i] = real_input(rank, i);
      world->allreduce(std::span<float>(y))->wait();
      for (size_t i = 0; i < n; ++i) {
        ASSERT_NEAR(y[i], real_sum[i], 1e-5 * kWorld) << "n=" << n << " index " << i;
      }
    }
    world->shutdown(std::chrono::seconds(60));
  });
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace hsgd::comm
