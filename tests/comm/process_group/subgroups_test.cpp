// new_group / new_subgroups / new_subgroups_by_enumeration across separate processes: membership,
// rank mapping, and collectives staying inside their group.

#include <gtest/gtest.h>

#include "comm/error.h"
#include "comm/process_group/process_group.h"
#include "tests/support/world.h"

namespace hsgd::comm {
namespace {

using hsgd::testing::run_world;

const hsgd::testing::WorldOptions kOptions{.deadline = std::chrono::seconds(90),
                                           .timeout = std::chrono::seconds(30)};

// Sum over the group of the global ranks, by allreduce; compared to the expected member list.
void expect_group(const std::shared_ptr<ProcessGroup>& g, const std::vector<int>& members,
                  int global_rank) {
  ASSERT_NE(g, nullptr) << "rank " << global_rank << " should be in a group of " << members.size();
  EXPECT_EQ(g->ranks(), members);
  EXPECT_EQ(g->size(), static_cast<int>(members.size()));
  ASSERT_EQ(g->ranks()[static_cast<size_t>(g->rank())], global_rank);
  std::vector<double> x{static_cast<double>(global_rank), 1.0};
  g->allreduce(std::span<double>(x))->wait();
  double expected = 0;
  for (int m : members) expected += m;
  EXPECT_EQ(x[0], expected) << "group " << g->name();
  EXPECT_EQ(x[1], static_cast<double>(members.size())) << "group " << g->name();
}

std::vector<int> iota(int begin, int count) {
  std::vector<int> v(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) v[static_cast<size_t>(i)] = begin + i;
  return v;
}

class SubgroupsTest : public ::testing::TestWithParam<int> {};

TEST_P(SubgroupsTest, ContiguousSubgroupsOfEveryDivisor) {
  const int world = GetParam();
  auto result = run_world(world, kOptions, [&](int rank, const auto& pg) {
    for (int g = 1; g <= world; ++g) {
      if (world % g != 0) {
        try {
          new_subgroups(pg, g);
          ADD_FAILURE() << "group_size " << g << " does not divide " << world;
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("group_size " + std::to_string(g)),
                    std::string::npos)
              << e.what();
        }
        continue;
      }
      auto [mine, all] = new_subgroups(pg, g);
      ASSERT_EQ(all.size(), static_cast<size_t>(world / g));
      for (size_t i = 0; i < all.size(); ++i) {
        EXPECT_EQ(all[i] != nullptr, static_cast<int>(i) == rank / g) << "subgroup " << i;
      }
      expect_group(mine, iota(rank / g * g, g), rank);
      // `mine` is destroyed at the end of this iteration: its members meet first, so no rank
      // closes the group's connections while a peer still receives the tail of the allreduce.
      mine->shutdown(std::chrono::seconds(30));
    }
    pg->shutdown(std::chrono::seconds(30));
  });
  EXPECT_RANKS_OK(result);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SubgroupsTest, ::testing::Values(4, 6, 8),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(SubgroupsTest, NewGroupAndEnumeration_NonMembersGetNull) {
  auto result = run_world(7, kOptions, [&](int rank, const auto& pg) {
    // Unsorted input: the group's rank order is the sorted order, as in torch.
    auto odds = new_group(pg, {5, 1, 3});
    if (rank % 2 == 1 && rank < 7) {
      expect_group(odds, {1, 3, 5}, rank);
    } else {
      EXPECT_EQ(odds, nullptr);
    }
    // Rank 6 is in no list.
    auto [mine, all] = new_subgroups_by_enumeration(pg, {{0, 4}, {1, 2, 5}, {3}});
    ASSERT_EQ(all.size(), 3u);
    if (rank == 0 || rank == 4) expect_group(mine, {0, 4}, rank);
    if (rank == 1 || rank == 2 || rank == 5) expect_group(mine, {1, 2, 5}, rank);
    if (rank == 3) expect_group(mine, {3}, rank);
    if (rank == 6) {
      EXPECT_EQ(mine, nullptr);
    }
    // A subgroup of a subgroup: ranks are the parent's, global ranks map through.
    if (mine != nullptr && mine->size() == 3) {
      auto inner = new_group(mine, {1, 2});  // parent ranks 1, 2 = global 2, 5
      if (rank == 2 || rank == 5) {
        expect_group(inner, {2, 5}, rank);
      } else {
        EXPECT_EQ(inner, nullptr);
      }
    }
    // The world still works after its subgroups were made.
    expect_group(pg, iota(0, 7), rank);
    // Every rank finished every collective before any group is destroyed (at exit).
    pg->shutdown(std::chrono::seconds(30));
  });
  EXPECT_RANKS_OK(result);
}

TEST(SubgroupsTest, InvalidListsAreRejectedOnEveryRank) {
  auto pg = init_process_group({});
  EXPECT_THROW(new_subgroups(pg, 0), InvalidArgument);
  EXPECT_THROW(new_subgroups(pg, 2), InvalidArgument);
  EXPECT_THROW(new_group(pg, {}), InvalidArgument);
  EXPECT_THROW(new_group(pg, {0, 0}), InvalidArgument);
  try {
    new_group(pg, {1});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(new_subgroups_by_enumeration(pg, {{0}, {0}}), InvalidArgument);
  EXPECT_THROW(new_subgroups_by_enumeration(pg, {}), InvalidArgument);
  auto self = new_group(pg, {0});
  ASSERT_NE(self, nullptr);
  EXPECT_EQ(self->size(), 1);
}

}  // namespace
}  // namespace hsgd::comm
