// The node layout has one source of truth: InitOptions::local_world_size (LOCAL_WORLD_SIZE,
// read once by InitOptions::from_env), kept by the world group and inherited by its subgroups;
// intra_node_subgroup (the null subgroup of post_localSGD_hook) asks the group, not the
// environment. World sizes 1..6, odd ones included; nodes with different numbers of ranks
// (GROUP_RANK declared) give each node's actual members.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/error.h"
#include "comm/process_group/process_group.h"
#include "comm/store/file_store.h"
#include "framework/distributed/comm_hooks/post_local_sgd_hook.h"
#include "tests/framework/distributed/dist_test_util.h"
#include "tests/support/error_message.h"
#include "tests/support/multiprocess.h"
#include "tests/support/world.h"

namespace hsgd::distributed {
namespace {

constexpr std::chrono::seconds kRankDeadline{60};
using hsgd::testing::run_ranks;
using hsgd::testing::unique_temp_dir;
using ::testing::HasSubstr;

std::shared_ptr<comm::ProcessGroup> world_with_layout(int rank, int world_size,
                                                      int local_world_size,
                                                      const std::filesystem::path& dir) {
  return comm::init_process_group({.rank = rank,
                                   .world_size = world_size,
                                   .local_world_size = local_world_size,
                                   .store = std::make_shared<comm::FileStore>(dir),
                                   .token = "test-token",
                                   .timeout = std::chrono::seconds(20)});
}

std::vector<int> contiguous(int first, int count) {
  std::vector<int> ranks;
  for (int r = first; r < first + count; ++r) ranks.push_back(r);
  return ranks;
}

TEST(IntraNodeSubgroupTest, NodesOfLocalWorldSizeFromTheGroup_NotTheEnvironment) {
  struct Case {
    int world, local;
  };
  for (const Case c : {Case{1, 1}, Case{2, 1}, Case{3, 3}, Case{4, 2}, Case{6, 3}, Case{6, 2}}) {
    const auto dir = unique_temp_dir("intra_node");
    auto result = run_ranks(c.world, kRankDeadline, [&](int rank) {
      // A stale variable in the environment must not matter: the group is the source of truth.
      ::setenv("LOCAL_WORLD_SIZE", "5", 1);
      auto world = world_with_layout(rank, c.world, c.local, dir);
      EXPECT_EQ(world->local_world_size(), c.local);
      auto node = intra_node_subgroup(world);
      ASSERT_NE(node, nullptr);
      EXPECT_EQ(node->ranks(), contiguous(rank / c.local * c.local, c.local))
          << "world " << c.world << ", local world size " << c.local << ", rank " << rank;
      // Subgroups keep the job's layout: it describes nodes, not members.
      auto all = comm::new_group(world, contiguous(0, c.world));
      EXPECT_EQ(all->local_world_size(), c.local);
      EXPECT_EQ(node->local_world_size(), c.local);
      hsgd::testing::leave_together(*world);
    });
    EXPECT_RANKS_OK(result) << "world " << c.world << ", local world size " << c.local;
    std::filesystem::remove_all(dir);
  }
}

// hsgd-run with --nproc-per-node 3 on one node and 1 on another. Each rank's
// intra-node group is its node's members (not LOCAL_WORLD_SIZE contiguous ranks, which do not
// fit), and it allreduces within exactly them.
class UnevenNodesTest : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(UnevenNodesTest, IntraNodeGroupIsTheNodesMembers) {
  const std::vector<int> sizes = GetParam();
  std::vector<std::vector<int>> node_of_rank;  // the members of each rank's node
  for (size_t node = 0, first = 0; node < sizes.size(); first += sizes[node], ++node) {
    for (int i = 0; i < sizes[node]; ++i) {
      node_of_rank.push_back(contiguous(static_cast<int>(first), sizes[node]));
    }
  }
  const int world = static_cast<int>(node_of_rank.size());
  auto result =
      hsgd::testing::run_world(world, {.node_sizes = sizes}, [&](int rank, const auto& pg) {
        const std::vector<int>& members = node_of_rank[static_cast<size_t>(rank)];
        auto node = intra_node_subgroup(pg);
        ASSERT_NE(node, nullptr);
        EXPECT_EQ(node->ranks(), members) << "rank " << rank;
        if (members.size() == static_cast<size_t>(world)) {
          EXPECT_EQ(node, pg);
        }
        std::vector<float> x{static_cast<float>(rank + 1)};
        node->allreduce(std::span<float>(x))->wait(node->work_timeout());
        float expected = 0;
        for (int r : members) expected += static_cast<float>(r + 1);
        EXPECT_EQ(x[0], expected) << "rank " << rank << ": sum over its node";
      });
  EXPECT_RANKS_OK(result);
}

INSTANTIATE_TEST_SUITE_P(Layouts, UnevenNodesTest,
                         ::testing::Values(std::vector<int>{3, 1}, std::vector<int>{2, 1, 1},
                                           std::vector<int>{1, 3}, std::vector<int>{4}),
                         [](const auto& info) { return testing::node_layout_name(info.param); });

// Equal nodes that also declare their node ranks: torch's contiguous groups, the same groups
// (ranks and names, i.e. key prefixes) as new_subgroups(LOCAL_WORLD_SIZE) made before.
TEST(IntraNodeSubgroupTest, EqualDeclaredNodes_AreTorchsContiguousGroups) {
  for (const std::vector<int>& sizes : {std::vector<int>{2, 2}, std::vector<int>{3, 3}}) {
    const int per_node = sizes[0];
    const int world = per_node * static_cast<int>(sizes.size());
    auto result =
        hsgd::testing::run_world(world, {.node_sizes = sizes}, [&](int rank, const auto& pg) {
          auto node = intra_node_subgroup(pg);
          ASSERT_NE(node, nullptr);
          EXPECT_EQ(node->ranks(), contiguous(rank / per_node * per_node, per_node));
          EXPECT_EQ(node->name(), "world/g" + std::to_string(rank / per_node));
        });
    EXPECT_RANKS_OK(result) << "nodes of " << per_node;
  }
}

TEST(IntraNodeSubgroupTest, NotDeclared_IsTheWholeGroup) {
  const auto dir = unique_temp_dir("intra_node_undeclared");
  auto result = run_ranks(3, kRankDeadline, [&](int rank) {
    ::unsetenv("LOCAL_WORLD_SIZE");
    auto world = world_with_layout(rank, 3, /*local_world_size=*/0, dir);
    EXPECT_EQ(world->local_world_size(), 0);
    EXPECT_EQ(intra_node_subgroup(world), world);
    hsgd::testing::leave_together(*world);
  });
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

TEST(IntraNodeSubgroupTest, LocalWorldSizeNotDividingTheGroup_NamesBoth) {
  const auto dir = unique_temp_dir("intra_node_bad");
  auto result = run_ranks(4, kRankDeadline, [&](int rank) {
    auto world = world_with_layout(rank, 4, /*local_world_size=*/3, dir);
    const std::string message = hsgd::testing::error_message([&] { intra_node_subgroup(world); });
    EXPECT_THAT(message, HasSubstr("LOCAL_WORLD_SIZE 3"));
    EXPECT_THAT(message, HasSubstr("must divide the size 4"));
    hsgd::testing::leave_together(*world);
  });
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

TEST(IntraNodeSubgroupTest, NegativeLocalWorldSize_IsRejected) {
  const auto dir = unique_temp_dir("intra_node_negative");
  const std::string message =
      hsgd::testing::error_message([&] { world_with_layout(0, 1, -2, dir); });
  EXPECT_THAT(message, HasSubstr("local_world_size -2 must be >= 0"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace hsgd::distributed
