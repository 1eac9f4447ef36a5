// Agreement checks (comm/process_group/agreement.h) and the byte allgather under them
// (ProcessGroup::allgather_bytes), across separate processes: every rank receives every rank's
// bytes whatever their lengths, and a disagreement is reported on every rank with the ranks
// holding each value.

#include "comm/process_group/agreement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/error.h"
#include "comm/process_group/process_group.h"
#include "tests/support/error_message.h"
#include "tests/support/world.h"

namespace hsgd::comm {
namespace {

using hsgd::testing::error_message;
using hsgd::testing::run_world;
using ::testing::HasSubstr;

// Rank r's bytes: r * 37 bytes (none for rank 0), with a NUL inside, different on every rank.
std::string bytes_of(int rank) {
  std::string out(static_cast<size_t>(rank) * 37, static_cast<char>('a' + rank));
  if (!out.empty()) out[out.size() / 2] = '\0';
  return out;
}

// Every rank's collectives still run after the check, so it left no message in flight.
void expect_group_usable(ProcessGroup& pg) {
  std::vector<float> x{1.0f};
  pg.allreduce(std::span<float>(x))->wait();
  EXPECT_EQ(x[0], static_cast<float>(pg.size())) << "allreduce after the check";
}

TEST(GroupRanksByValueTest, GroupsInTheOrderOfTheirLowestRank) {
  const std::vector<RanksWithValue> groups = group_ranks_by_value({"b", "a", "b", "c", "a"});
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].value, "b");
  EXPECT_EQ(groups[0].ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(groups[1].value, "a");
  EXPECT_EQ(groups[1].ranks, (std::vector<int>{1, 4}));
  EXPECT_EQ(groups[2].value, "c");
  EXPECT_EQ(groups[2].ranks, (std::vector<int>{3}));
}

TEST(GroupRanksByValueTest, ExplicitRanksNameTheHolders) {
  const std::vector<RanksWithValue> groups = group_ranks_by_value({"x", "y", "x"}, {1, 4, 6});
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].ranks, (std::vector<int>{1, 6}));
  EXPECT_EQ(groups[1].ranks, (std::vector<int>{4}));
  EXPECT_THAT(error_message([] {
                group_ranks_by_value({"x", "y"}, {0});
              }),
              HasSubstr("1 ranks for 2 values"));
}

class AllgatherBytesTest : public ::testing::TestWithParam<int> {};

TEST_P(AllgatherBytesTest, EveryRankReceivesEveryRanksBytesWhateverTheirLength) {
  auto result = run_world(GetParam(), [&](int rank, const auto& pg) {
    std::vector<std::string> all{"stale"};
    const std::string mine = bytes_of(rank);
    pg->allgather_bytes(mine, all, "bytes")->wait();
    ASSERT_EQ(all.size(), static_cast<size_t>(pg->size()));
    for (int r = 0; r < pg->size(); ++r) {
      EXPECT_EQ(all[static_cast<size_t>(r)], bytes_of(r)) << "rank " << rank << " from " << r;
    }
    // Every rank empty: an empty string from each.
    pg->allgather_bytes("", all)->wait();
    EXPECT_EQ(all, std::vector<std::string>(static_cast<size_t>(pg->size())));
    expect_group_usable(*pg);
  });
  EXPECT_RANKS_OK(result);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, AllgatherBytesTest, ::testing::Values(1, 2, 3, 5));

TEST(CheckAgreementTest, EqualDescriptions_Pass) {
  auto result = run_world(3, [&](int, const auto& pg) {
    check_agreement(*pg, "Test", "settings", "lr 0.1, 4 layers");
    EXPECT_TRUE(gather_if_different(*pg, "same", "test").empty());
    expect_group_usable(*pg);
  });
  EXPECT_RANKS_OK(result);
}

TEST(CheckAgreementTest, Mismatch_ThrowsOnEveryRankNamingWhatAndTheRanksOfEachValue) {
  auto result = run_world(4, [&](int rank, const auto& pg) {
    // Ranks 0 and 2 agree; ranks 1 and 3 each hold another value ("BA" has the length of "AB").
    const std::string mine = rank == 1 ? "BA" : rank == 3 ? "a longer one" : "AB";
    const std::string message =
        error_message([&] { check_agreement(*pg, "Test", "settings", mine); });
    EXPECT_THAT(message, HasSubstr("Test: the ranks of group 'world' passed different settings: "
                                   "ranks [0, 2] have AB; ranks [1] have BA; ranks [3] have a "
                                   "longer one; every rank must pass the same (this is rank " +
                                   std::to_string(rank) + ")"))
        << "rank " << rank;
    expect_group_usable(*pg);
  });
  EXPECT_RANKS_OK(result);
}

TEST(CheckAgreementTest, GatherIfDifferent_ReturnsEveryRanksDescriptionByRank) {
  auto result = run_world(3, [&](int rank, const auto& pg) {
    const std::vector<std::string> all =
        gather_if_different(*pg, rank == 2 ? "two" : "other", "test");
    EXPECT_EQ(all, (std::vector<std::string>{"other", "other", "two"})) << "rank " << rank;
  });
  EXPECT_RANKS_OK(result);
}

TEST(CheckAgreementTest, GroupOfOne_AlwaysAgrees) {
  auto result = run_world(1, [&](int, const auto& pg) {
    check_agreement(*pg, "Test", "settings", "anything");
    EXPECT_TRUE(gather_if_different(*pg, "anything", "test").empty());
  });
  EXPECT_RANKS_OK(result);
}

}  // namespace
}  // namespace hsgd::comm
