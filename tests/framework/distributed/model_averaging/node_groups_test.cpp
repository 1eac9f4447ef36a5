// HierarchicalModelAverager with "node" levels (kNodeGroup): a level whose
// groups are the ranks of each node as the launcher declared them, also when nodes run
// different numbers of ranks (3 + 1, 2 + 1 + 1), where no contiguous equal groups fit. Each rank
// is a separate process (run_world with emulated nodes).

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "comm/error.h"
#include "framework/distributed/model_averaging/hierarchical_model_averager.h"
#include "tests/framework/distributed/dist_test_util.h"
#include "tests/support/world.h"

namespace hsgd::distributed {
namespace {

using hsgd::testing::expect_all_equal;
using hsgd::testing::run_world;
using H = std::vector<std::pair<int64_t, int>>;

// A (5, 1) parameter filled with value, with a gradient so that the averager does not skip it.
Tensor make_param(float value) {
  Tensor p = full({5, 1}, value).set_requires_grad(true);
  p.set_grad(ones({5, 1}));
  return p;
}

// The members of each rank's node when node i runs sizes[i] contiguous ranks.
std::vector<std::vector<int>> members_by_rank(const std::vector<int>& sizes) {
  std::vector<std::vector<int>> out;
  int first = 0;
  for (int size : sizes) {
    std::vector<int> node;
    for (int i = 0; i < size; ++i) node.push_back(first + i);
    for (int i = 0; i < size; ++i) out.push_back(node);
    first += size;
  }
  return out;
}

// Value of rank r at step s: distinct per rank and step, so a wrong group shows.
float value_of(int rank, int64_t step) {
  return static_cast<float>(rank * rank + 1) + 0.25f * static_cast<float>(step);
}

float mean_of(const std::vector<int>& ranks, int64_t step) {
  float sum = 0;
  for (int r : ranks) sum += value_of(r, step);
  return sum / static_cast<float>(ranks.size());
}

void expect_invalid(const std::function<void()>& make, const std::string& expected,
                    const std::string& what) {
  try {
    make();
    ADD_FAILURE() << what << ": no exception, expected one containing '" << expected << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
        << what << ": got '" << e.what() << "'";
  }
}

class NodeLevelTest : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(NodeLevelTest, AveragesExactlyWithinEachNode) {
  const std::vector<int> sizes = GetParam();
  const auto members = members_by_rank(sizes);
  const int world = static_cast<int>(members.size());
  std::vector<int> everyone;
  for (int r = 0; r < world; ++r) everyone.push_back(r);
  auto result = run_world(world, {.node_sizes = sizes}, [&](int rank, const auto& pg) {
    const std::vector<int>& node = members[static_cast<size_t>(rank)];
    HierarchicalModelAverager averager({{2, kNodeGroup}, {4, kWholeGroup}}, /*warmup_steps=*/1, pg);
    EXPECT_EQ(averager.period_group_size(), (H{{2, kNodeGroup}, {4, world}}));
    ASSERT_EQ(averager.level_groups().size(), 2u);
    EXPECT_EQ(averager.level_groups()[0]->ranks(), node) << "rank " << rank;
    EXPECT_EQ(averager.level_groups()[1], pg);
    Tensor p = make_param(0);
    for (int64_t step = 0; step < 9; ++step) {
      p.fill_(value_of(rank, step));
      averager.average_parameters(std::vector<Tensor>{p});
      // Warm-up 1; then every 4 steps all ranks, else every 2 steps each node.
      const float expected = step < 1        ? value_of(rank, step)
                             : step % 4 == 0 ? mean_of(everyone, step)
                             : step % 2 == 0 ? mean_of(node, step)
                                             : value_of(rank, step);
      expect_all_equal(p, expected,
                       "rank " + std::to_string(rank) + " step " + std::to_string(step));
    }
    // Steps 2 and 6 averaged within the node, 4 and 8 over everyone.
    ASSERT_EQ(averager.level_stats().size(), 2u);
    EXPECT_EQ(averager.level_stats()[0].calls, 2);
    EXPECT_EQ(averager.level_stats()[0].group_size, static_cast<int>(node.size()));
    EXPECT_EQ(averager.level_stats()[1].calls, 2);
    EXPECT_EQ(averager.level_stats()[1].group_size, world);
  });
  EXPECT_RANKS_OK(result);
}

INSTANTIATE_TEST_SUITE_P(Layouts, NodeLevelTest,
                         ::testing::Values(std::vector<int>{3, 1}, std::vector<int>{2, 1, 1},
                                           std::vector<int>{1, 3}),
                         [](const auto& info) { return testing::node_layout_name(info.param); });

// Three levels on 2 + 2 + 1 + 1 + 2 nodes: pairs inside nodes of two do not exist for the
// single-rank nodes, so the innermost level is single ranks (a no-op), then nodes, then all.
TEST(NodeLevel, BetweenNumericLevels_NestsAndAveragesPerNode) {
  const std::vector<int> sizes{2, 2, 1, 1, 2};
  const auto members = members_by_rank(sizes);
  auto result = run_world(8, {.node_sizes = sizes}, [&](int rank, const auto& pg) {
    HierarchicalModelAverager averager({{2, 1}, {4, kNodeGroup}, {8, 8}}, 0, pg);
    EXPECT_EQ(averager.level_groups()[1]->ranks(), members[static_cast<size_t>(rank)]);
    Tensor p = make_param(value_of(rank, 4));
    averager.set_step(4);
    averager.average_parameters(std::vector<Tensor>{p});
    expect_all_equal(p, mean_of(members[static_cast<size_t>(rank)], 4), "step 4");
  });
  EXPECT_RANKS_OK(result);
}

// Equal nodes: a node level is the contiguous level of the same size, bit for bit.
TEST(NodeLevel, EqualNodes_SameGroupsAndValuesAsContiguousLevel) {
  auto result = run_world(4, {.node_sizes = {2, 2}}, [&](int rank, const auto& pg) {
    HierarchicalModelAverager by_node({{2, kNodeGroup}, {4, kWholeGroup}}, 0, pg);
    HierarchicalModelAverager by_size({{2, 2}, {4, 4}}, 0, pg);
    EXPECT_EQ(by_node.level_groups()[0]->ranks(), by_size.level_groups()[0]->ranks());
    for (int64_t step = 0; step < 5; ++step) {
      // Values whose mean rounds, so that a different summation order would show.
      const float v = 0.1f * static_cast<float>(rank + 1) + 1.0f / 3.0f * static_cast<float>(step);
      Tensor a = make_param(v), b = make_param(v);
      by_node.average_parameters(std::vector<Tensor>{a});
      by_size.average_parameters(std::vector<Tensor>{b});
      EXPECT_EQ(a.to_vector(), b.to_vector()) << "step " << step << " rank " << rank;
    }
  });
  EXPECT_RANKS_OK(result);
}

TEST(NodeLevel, UndeclaredNodes_FollowLocalWorldSizeOrAreOneNode) {
  // LOCAL_WORLD_SIZE 2, no GROUP_RANK: nodes of 2 contiguous ranks.
  auto result = run_world(4, {.local_world_size = 2}, [&](int rank, const auto& pg) {
    HierarchicalModelAverager averager({{2, kNodeGroup}, {4, kWholeGroup}}, 0, pg);
    EXPECT_EQ(averager.level_groups()[0]->ranks(),
              (std::vector<int>{rank / 2 * 2, rank / 2 * 2 + 1}));
  });
  EXPECT_RANKS_OK(result);
  // Nothing declared: one node, so the node level is the whole group and covers the next level.
  result = run_world(3, [&](int, const auto& pg) {
    HierarchicalModelAverager averager({{2, kNodeGroup}, {8, kWholeGroup}}, 0, pg);
    EXPECT_EQ(averager.period_group_size(), (H{{2, 3}}));
    EXPECT_EQ(averager.level_groups()[0], pg);
  });
  EXPECT_RANKS_OK(result);
}

TEST(NodeLevel, Errors_NameTheLevelAndTheNodes) {
  auto result = run_world(4, {.node_sizes = {3, 1}}, [&](int rank, const auto& pg) {
    auto hier = [&](H levels) {
      return [=] { HierarchicalModelAverager averager(levels, 0, pg); };
    };
    expect_invalid(hier({{2, kNodeGroup}}),
                   "the last level 2:node averages within each node, but the last level must be "
                   "the whole process group of 4 ranks",
                   "node last");
    expect_invalid(hier({{1, 2}, {2, kNodeGroup}, {4, kWholeGroup}}),
                   "groups must nest, but group [2, 3] of level 1:2 is split between groups "
                   "[0, 1, 2] [3] of level 2:node ({1:2, 2:node, 4:world} in process group "
                   "'world' of 4 ranks on nodes [0, 1, 2] [3])",
                   "pairs across nodes");
    expect_invalid(hier({{1, 3}, {2, kNodeGroup}, {4, kWholeGroup}}),
                   "group size 3 of level 1:3 must divide the process group size 4",
                   "size not dividing");
    expect_invalid(hier({{2, kNodeGroup}, {4, 2}, {8, 4}}),
                   "groups must nest, but group [0, 1, 2] of level 2:node is split between "
                   "groups [0, 1] [2, 3] of level 4:2",
                   "node inside pairs");
    expect_invalid(hier({{2, -2}, {4, 4}}),
                   "group size of entry 0 must be >= 1, or 0 for the whole group, or -1 "
                   "(kNodeGroup, 'node') for each node's ranks, got -2",
                   "negative size");
    expect_invalid(hier(rank == 3 ? H{{2, 2}, {4, 4}} : H{{2, kNodeGroup}, {4, 4}}),
                   "ranks [0, 1, 2] have {2:node, 4:4} warm-up 0; ranks [3] have {2:2, 4:4}",
                   "ranks disagree");
    // The group still works after the errors.
    HierarchicalModelAverager ok({{2, kNodeGroup}, {4, 4}}, 0, pg);
    Tensor p = make_param(value_of(rank, 2));
    ok.set_step(2);
    ok.average_parameters(std::vector<Tensor>{p});
    expect_all_equal(p, mean_of(rank < 3 ? std::vector<int>{0, 1, 2} : std::vector<int>{3}, 2),
                     "after errors");
  });
  EXPECT_RANKS_OK(result);
}

}  // namespace
}  // namespace hsgd::distributed
