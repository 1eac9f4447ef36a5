// comm/process_group/node_layout.h: which members of a group share a node, from each rank's
// declared node (GROUP_RANK) and LOCAL_WORLD_SIZE. The rule (NodeLayout::nodes) is checked on
// hand-written layouts; gather_node_layout on uneven emulated nodes (3 + 1, 2 + 1 + 1, 1 + 3), each
// rank a separate process.

#include "comm/process_group/node_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/error.h"
#include "comm/process_group/process_group.h"
#include "tests/framework/distributed/dist_test_util.h"
#include "tests/support/error_message.h"
#include "tests/support/world.h"

namespace hsgd::comm {
namespace {

using hsgd::testing::error_message;
using hsgd::testing::run_world;
using ::testing::HasSubstr;
using Lists = std::vector<std::vector<int>>;

NodeLayout layout(std::vector<int> node_ranks, std::vector<int> local_world_sizes) {
  NodeLayout out;
  out.group_name = "test";
  out.node_ranks = std::move(node_ranks);
  out.local_world_sizes = std::move(local_world_sizes);
  return out;
}

TEST(NodeLayoutTest, DeclaredNodes_GroupRanksByNode) {
  EXPECT_EQ(layout({0, 0, 0, 1}, {3, 3, 3, 1}).nodes(), (Lists{{0, 1, 2}, {3}}));
  EXPECT_EQ(layout({0, 1, 1, 1}, {1, 3, 3, 3}).nodes(), (Lists{{0}, {1, 2, 3}}));
  EXPECT_EQ(layout({0, 0, 1, 2}, {2, 2, 1, 1}).nodes(), (Lists{{0, 1}, {2}, {3}}));
  // Not contiguous (srun's cyclic distribution): still each node's actual members.
  EXPECT_EQ(layout({0, 1, 0, 1}, {2, 2, 2, 2}).nodes(), (Lists{{0, 2}, {1, 3}}));
  // Nodes by node rank, not by their first member.
  EXPECT_EQ(layout({1, 1, 0}, {2, 2, 1}).nodes(), (Lists{{2}, {0, 1}}));
  // A subgroup holding part of a node.
  EXPECT_EQ(layout({0, 1}, {3, 1}).nodes(), (Lists{{0}, {1}}));
}

TEST(NodeLayoutTest, UndeclaredNodes_ContiguousGroupsOfLocalWorldSize) {
  EXPECT_EQ(layout({-1, -1, -1, -1}, {2, 2, 2, 2}).nodes(), (Lists{{0, 1}, {2, 3}}));
  EXPECT_EQ(layout({-1, -1, -1}, {0, 0, 0}).nodes(), (Lists{{0, 1, 2}}));
}

TEST(NodeLayoutTest, UniformLocalWorldSize) {
  EXPECT_EQ(layout({0, 0, 1, 1}, {2, 2, 2, 2}).uniform_local_world_size(), 2);
  EXPECT_EQ(layout({0, 0, 0, 1}, {3, 3, 3, 1}).uniform_local_world_size(), -1);
  EXPECT_EQ(layout({-1, -1}, {0, 0}).uniform_local_world_size(), 0);
}

TEST(NodeLayoutTest, InconsistentLayouts_NameTheRanksAndValues) {
  EXPECT_THAT(error_message([] {
                layout({0, -1, 0, -1}, {2, 2, 2, 2}).nodes();
              }),
              HasSubstr("ranks [1, 3] declared no node rank (GROUP_RANK) but ranks [0, 2] did"));
  EXPECT_THAT(error_message([] {
                layout({-1, -1, -1, -1}, {3, 3, 3, 1}).nodes();
              }),
              HasSubstr("different LOCAL_WORLD_SIZEs [3, 3, 3, 1] but no node rank"));
  EXPECT_THAT(error_message([] {
                layout({-1, -1, -1, -1}, {3, 3, 3, 3}).nodes();
              }),
              HasSubstr("LOCAL_WORLD_SIZE 3 must divide the size 4"));
  EXPECT_THAT(error_message([] {
                layout({0, 0, 0, 0}, {3, 3, 3, 1}).nodes();
              }),
              HasSubstr("ranks 0 and 3 of node 0 declared LOCAL_WORLD_SIZE 3 and 1"));
  EXPECT_THAT(error_message([] {
                layout({0, 0, 0, 1}, {2, 2, 2, 1}).nodes();
              }),
              HasSubstr("node 0 has 3 members [0, 1, 2] but they declared LOCAL_WORLD_SIZE 2"));
}

// The launcher's layouts: node i runs node_sizes[i] contiguous ranks.
class GatherNodeLayoutTest : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(GatherNodeLayoutTest, EveryRankLearnsEveryNode) {
  const std::vector<int> sizes = GetParam();
  int world = 0;
  Lists expected;
  std::vector<int> node_of, size_of;
  for (size_t node = 0; node < sizes.size(); ++node) {
    expected.emplace_back();
    for (int i = 0; i < sizes[node]; ++i) {
      expected.back().push_back(world++);
      node_of.push_back(static_cast<int>(node));
      size_of.push_back(sizes[node]);
    }
  }
  auto result = run_world(world, {.node_sizes = sizes}, [&](int rank, const auto& pg) {
    EXPECT_EQ(pg->node_rank(), node_of[static_cast<size_t>(rank)]);
    const NodeLayout got = gather_node_layout(*pg);
    EXPECT_EQ(got.node_ranks, node_of);
    EXPECT_EQ(got.local_world_sizes, size_of);
    EXPECT_EQ(got.nodes(), expected) << "rank " << rank;
    // A subgroup without rank 0 keeps each member's node (ranks renumbered within the group).
    std::vector<int> rest;
    for (int r = 1; r < world; ++r) rest.push_back(r);
    auto sub = new_group(pg, rest);
    if (sub == nullptr) return;
    EXPECT_EQ(sub->node_rank(), node_of[static_cast<size_t>(rank)]);
    Lists sub_expected;
    for (const auto& node : expected) {
      std::vector<int> members;
      for (int r : node) {
        if (r > 0) members.push_back(r - 1);
      }
      if (!members.empty()) sub_expected.push_back(members);
    }
    EXPECT_EQ(gather_node_layout(*sub).nodes(), sub_expected) << "rank " << rank;
    hsgd::testing::leave_together(*sub);
  });
  EXPECT_RANKS_OK(result);
}

INSTANTIATE_TEST_SUITE_P(Layouts, GatherNodeLayoutTest,
                         ::testing::Values(std::vector<int>{3, 1}, std::vector<int>{2, 1, 1},
                                           std::vector<int>{1, 3}, std::vector<int>{2, 2}),
                         [](const auto& info) { return testing::node_layout_name(info.param); });

}  // namespace
}  // namespace hsgd::comm
