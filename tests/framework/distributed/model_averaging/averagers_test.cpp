// Ports of PyTorch's model-averaging tests (torch/testing/_internal/distributed/
// distributed_test.py: test_periodic_model_averager, ..._param_group,
// test_1_level_hierarchical_model_averager_equivalent_to_periodic_model_averager,
// test_3_level_hierarchical_model_averager) plus hsgd's validation, buffers and counters.
// Every rank is a separate process (tests/support/multiprocess.h).

#include "framework/distributed/model_averaging/averagers.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "comm/error.h"
#include "framework/distributed/model_averaging/hierarchical_model_averager.h"
#include "framework/distributed/model_averaging/utils.h"
#include "tests/framework/distributed/dist_test_util.h"
#include "tests/support/world.h"

namespace hsgd::distributed {
namespace {

using hsgd::testing::expect_all_equal;
using hsgd::testing::run_world;

// A (5, 1) parameter (torch's nn.Linear(1, 5, bias=False).weight) filled with value, with a
// mock gradient of ones so the averagers do not skip it.
Tensor make_param(float value) {
  Tensor p = full({5, 1}, value).set_requires_grad(true);
  p.set_grad(ones({5, 1}));
  return p;
}

float mean_of_ranks(int first, int count) {
  float sum = 0;
  for (int r = first; r < first + count; ++r) sum += static_cast<float>(r);
  return sum / static_cast<float>(count);
}

class AveragerTest : public ::testing::TestWithParam<int> {};

TEST_P(AveragerTest, Periodic_AveragesAfterWarmupEveryPeriod) {
  const int world = GetParam();
  auto result = run_world(world, [&](int rank, const auto& pg) {
    Tensor param = make_param(0);
    const int64_t period = 4;
    for (int64_t warmup : {12, 13, 14, 15}) {
      PeriodicModelAverager averager(period, warmup, pg);
      int64_t averagings = 0;
      for (int64_t step = 0; step < 20; ++step) {
        param.fill_(static_cast<float>(rank));  // reset at every step
        averager.average_parameters(std::vector<Tensor>{param});
        const bool averaged = step >= warmup && (step - warmup) % period == 0;
        averagings += averaged;
        expect_all_equal(param, averaged ? mean_of_ranks(0, world) : static_cast<float>(rank),
                         "warmup " + std::to_string(warmup) + " step " + std::to_string(step));
      }
      EXPECT_EQ(averager.step(), 20);
      // One level: every averaging of the (5, 1) parameter counted, with its exact payload.
      ASSERT_EQ(averager.level_stats().size(), 1u);
      const AveragingLevelStats& stats = averager.level_stats()[0];
      EXPECT_EQ(stats.period, period);
      EXPECT_EQ(stats.group_size, world);
      EXPECT_EQ(stats.calls, averagings) << "warmup " << warmup;
      EXPECT_EQ(stats.bytes, averagings * 5 * static_cast<int64_t>(sizeof(float)));
      EXPECT_GT(stats.seconds, 0.0) << "an allreduce between processes took no time";
    }
  });
  EXPECT_RANKS_OK(result);
}

TEST_P(AveragerTest, Periodic_ParamGroupsSkipParamsWithoutGrad) {
  const int world = GetParam();
  auto result = run_world(world, [&](int rank, const auto& pg) {
    Tensor a = make_param(0), b = make_param(0);
    Tensor no_grad = full({3}, 0).set_requires_grad(true);  // never got a gradient
    std::vector<ParamGroup> groups(2);
    groups[0].params = {a, no_grad};
    groups[1].params = {b};
    const int64_t period = 4;
    for (int64_t warmup : {12, 13, 14, 15}) {
      PeriodicModelAverager averager(period, warmup, pg);
      for (int64_t step = 0; step < 20; ++step) {
        for (Tensor t : {a, b, no_grad}) t.fill_(static_cast<float>(rank));
        averager.average_parameters(groups);
        const bool averaged = step >= warmup && (step - warmup) % period == 0;
        const float expected = averaged ? mean_of_ranks(0, world) : static_cast<float>(rank);
        expect_all_equal(a, expected, "group 0 param, step " + std::to_string(step));
        expect_all_equal(b, expected, "group 1 param, step " + std::to_string(step));
        expect_all_equal(no_grad, static_cast<float>(rank), "param without grad");
      }
    }
  });
  EXPECT_RANKS_OK(result);
}

TEST_P(AveragerTest, Hierarchical_OneLevelEqualsPeriodic) {
  // torch's version of this test overwrites its hierarchical averager with a periodic one
  // before using it, so it never compares them. Run side by side, they differ by design when
  // the warm-up is not a multiple of the period: the hierarchical schedule is
  // "step % period == 0" after warm-up, the periodic one "(step - warmup) % period == 0". Each is
  // checked against its own schedule, and they must agree when warmup % period == 0.
  const int world = GetParam();
  auto result = run_world(world, [&](int rank, const auto& pg) {
    Tensor p1 = make_param(0), p2 = make_param(0);
    const int64_t period = 4;
    const float mean = mean_of_ranks(0, world), mine = static_cast<float>(rank);
    for (int64_t warmup : {12, 13, 14, 15}) {
      HierarchicalModelAverager hierarchical({{period, world}}, warmup, pg);
      PeriodicModelAverager periodic(period, warmup, pg);
      for (int64_t step = 0; step < 20; ++step) {
        p1.fill_(mine);
        p2.fill_(mine);
        hierarchical.average_parameters(std::vector<Tensor>{p1});
        periodic.average_parameters(std::vector<Tensor>{p2});
        const std::string at = "warmup " + std::to_string(warmup) + " step " + std::to_string(step);
        const bool hier_averaged = step >= warmup && step % period == 0;
        const bool periodic_averaged = step >= warmup && (step - warmup) % period == 0;
        expect_all_equal(p1, hier_averaged ? mean : mine, "hierarchical, " + at);
        expect_all_equal(p2, periodic_averaged ? mean : mine, "periodic, " + at);
        if (warmup % period == 0) {
          EXPECT_EQ(p1.to_vector(), p2.to_vector()) << at;
        }
      }
      EXPECT_EQ(hierarchical.step(), periodic.step());
    }
  });
  EXPECT_RANKS_OK(result);
}

TEST_P(AveragerTest, AverageParameters_SubgroupMembersAverageOthersUntouched) {
  const int world = GetParam();
  auto result = run_world(world, [&](int rank, const auto& pg) {
    Tensor with_grad = make_param(static_cast<float>(rank));
    Tensor without_grad = full({2}, static_cast<float>(rank)).set_requires_grad(true);
    average_parameters({with_grad, without_grad}, pg);
    expect_all_equal(with_grad, mean_of_ranks(0, world), "world average");
    expect_all_equal(without_grad, static_cast<float>(rank), "param without grad");

    // The first and the last rank: not contiguous, and the last is odd in odd worlds.
    auto ends = comm::new_group(pg, {0, world - 1});  // nullptr on the ranks in between
    ASSERT_EQ(ends != nullptr, rank == 0 || rank == world - 1);
    with_grad.fill_(static_cast<float>(rank));
    average_parameters({with_grad}, ends);
    const float ends_mean = static_cast<float>(world - 1) / 2;
    expect_all_equal(with_grad, ends != nullptr ? ends_mean : static_cast<float>(rank),
                     "group {0, " + std::to_string(world - 1) + "}");
  });
  EXPECT_RANKS_OK(result);
}

// Odd sizes too: the reductions and the subgroup ranks must not assume a power of two.
INSTANTIATE_TEST_SUITE_P(WorldSizes, AveragerTest, ::testing::Values(3, 4, 5, 7, 8),
                         [](const auto& info) { return "World" + std::to_string(info.param); });

TEST(HierarchicalModelAverager, ThreeLevels_LargestDividingPeriodSelectsTheGroup) {
  const int world = 8;
  auto result = run_world(world, [&](int rank, const auto& pg) {
    HierarchicalModelAverager averager({{2, 2}, {4, 4}, {8, 8}}, /*warmup_steps=*/10, pg);
    // The subgroups are made of contiguous ranks.
    const auto& groups = averager.level_groups();
    ASSERT_EQ(groups.size(), 3u);
    for (int level = 0; level < 2; ++level) {
      const int size = level == 0 ? 2 : 4;
      std::vector<int> expected(size);
      std::iota(expected.begin(), expected.end(), rank / size * size);
      EXPECT_EQ(groups[level]->ranks(), expected) << "level " << level;
    }
    EXPECT_EQ(groups[2], pg);

    Tensor param = make_param(0);
    for (int64_t step = 0; step < 25; ++step) {
      if (step == 10) {  // warm-up over: nothing averaged, nothing counted
        for (const AveragingLevelStats& level : averager.level_stats()) {
          EXPECT_EQ(level.calls, 0);
          EXPECT_EQ(level.bytes, 0);
          EXPECT_EQ(level.seconds, 0.0);
        }
      }
      param.fill_(static_cast<float>(rank));
      averager.average_parameters(std::vector<Tensor>{param});
      float expected = static_cast<float>(rank);  // no averaging
      if (step == 16 || step == 24) {
        expected = mean_of_ranks(0, 8);
      } else if (step == 12 || step == 20) {
        expected = mean_of_ranks(rank / 4 * 4, 4);
      } else if (step == 10 || step == 14 || step == 18 || step == 22) {
        expected = mean_of_ranks(rank / 2 * 2, 2);
      }
      expect_all_equal(param, expected, "step " + std::to_string(step));
    }
    // Steps 10..24: four averagings of pairs, two of fours, two global; each of the (5, 1)
    // parameter, 20 bytes.
    const auto& stats = averager.level_stats();
    ASSERT_EQ(stats.size(), 3u);
    const int64_t expected_calls[] = {4, 2, 2};
    const int64_t expected_period[] = {2, 4, 8};
    for (size_t level = 0; level < 3; ++level) {
      EXPECT_EQ(stats[level].period, expected_period[level]) << "level " << level;
      EXPECT_EQ(stats[level].group_size, 2 << level) << "level " << level;
      EXPECT_EQ(stats[level].calls, expected_calls[level]) << "level " << level;
      EXPECT_EQ(stats[level].bytes, expected_calls[level] * 5 * static_cast<int64_t>(sizeof(float)))
          << "level " << level;
      EXPECT_GT(stats[level].seconds, 0.0) << "level " << level << " averaged but took no time";
    }
  });
  EXPECT_RANKS_OK(result);
}

TEST(HierarchicalModelAverager, AverageBuffers_AveragedWithParameters) {
  const int world = 4;
  auto result = run_world(world, [&](int rank, const auto& pg) {
    Tensor param = make_param(static_cast<float>(rank));
    Tensor running_mean = full({3}, static_cast<float>(2 * rank));  // no grad, still averaged
    HierarchicalModelAverager averager({{1, 2}, {2, 4}}, 0, pg,
                                       ModelAveragerOptions{.average_buffers = {running_mean}});
    averager.average_parameters(std::vector<Tensor>{param});  // step 0: global
    expect_all_equal(param, mean_of_ranks(0, 4), "param");
    expect_all_equal(running_mean, 2 * mean_of_ranks(0, 4), "buffer");
    EXPECT_EQ(averager.level_stats()[0].calls, 0) << "step 0 selects the largest period";
    EXPECT_EQ(averager.level_stats()[1].calls, 1);
    EXPECT_EQ(averager.level_stats()[1].bytes, (5 + 3) * static_cast<int64_t>(sizeof(float)));
  });
  EXPECT_RANKS_OK(result);
}

TEST(HierarchicalModelAverager, OddGroupSize_ContiguousGroupsOfThree) {
  const int world = 6;
  auto result = run_world(world, [&](int rank, const auto& pg) {
    HierarchicalModelAverager averager({{2, 3}, {4, 6}}, /*warmup_steps=*/0, pg);
    const int first = rank / 3 * 3;
    EXPECT_EQ(averager.level_groups()[0]->ranks(), (std::vector<int>{first, first + 1, first + 2}));
    Tensor param = make_param(0);
    for (int64_t step = 0; step < 8; ++step) {
      param.fill_(static_cast<float>(rank));
      averager.average_parameters(std::vector<Tensor>{param});
      const float expected = step % 4 == 0   ? mean_of_ranks(0, world)
                             : step % 2 == 0 ? mean_of_ranks(first, 3)
                                             : static_cast<float>(rank);
      expect_all_equal(param, expected, "step " + std::to_string(step));
    }
    EXPECT_EQ(averager.level_stats()[0].calls, 2);  // steps 2 and 6
    EXPECT_EQ(averager.level_stats()[1].calls, 2);  // steps 0 and 4
  });
  EXPECT_RANKS_OK(result);
}

// Constructs an averager from a rank-dependent configuration and expects InvalidArgument whose
// message contains `expected` on this rank.
template <typename Make>
void expect_invalid(Make make, const std::string& expected, const std::string& what) {
  try {
    make();
    ADD_FAILURE() << what << ": no exception, expected one containing '" << expected << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
        << what << ": got '" << e.what() << "'";
  }
}

TEST(HierarchicalModelAverager, InvalidHierarchies_FailOnEveryRankWithoutHanging) {
  const int world = 4;
  auto result = run_world(world, [&](int rank, const auto& pg) {
    using H = std::vector<std::pair<int64_t, int>>;
    auto hier = [&](H levels, int64_t warmup = 0) {
      return [=] { HierarchicalModelAverager averager(levels, warmup, pg); };
    };
    expect_invalid(hier({}), "must not be empty", "empty");
    expect_invalid(hier({{0, 2}, {4, 4}}), "period of entry 0 must be >= 1, got 0", "period 0");
    expect_invalid(hier({{4, 2}, {2, 4}}),
                   "periods must strictly increase, but entry 1 has period 2 after period 4",
                   "decreasing periods");
    expect_invalid(hier({{2, 4}, {4, 2}}),
                   "group sizes must strictly increase, but entry 1 has group size 2",
                   "decreasing sizes");
    expect_invalid(hier({{2, 3}, {4, 4}}), "group size 3 of entry 0 does not divide 4",
                   "non-nesting sizes");
    expect_invalid(hier({{2, 2}}), "last group size 2 must equal the process group size 4",
                   "last size");
    // 8:8 does not fit 4 ranks and is dropped: the message names it.
    expect_invalid(hier({{2, 2}, {8, 8}}),
                   "entry 1 (8:8) of {2:2, 8:8} does not fit in the process group of 4 ranks "
                   "(group size larger than 4) and was dropped",
                   "last entry dropped");
    expect_invalid(hier({{1, 1}, {2, 2}, {8, 8}, {16, 16}}),
                   "entry 2 (8:8), entry 3 (16:16) of {1:1, 2:2, 8:8, 16:16} do not fit",
                   "two last entries dropped");
    expect_invalid(hier({{2, 2}, {4, 4}}, -1), "warmup_steps must be >= 0, got -1", "warm-up");
    // Ranks disagree: rank 3 has another warm-up. Everyone throws, nobody hangs.
    expect_invalid(hier({{2, 2}, {4, 4}}, rank == 3 ? 5 : 10),
                   "ranks [0, 1, 2] have {2:2, 4:4} warm-up 10; ranks [3] have {2:2, 4:4} "
                   "warm-up 5",
                   "disagreeing warm-up");
    // Ranks disagree, and only rank 0's hierarchy is invalid: still the same error everywhere.
    expect_invalid(hier(rank == 0 ? H{{2, 2}} : H{{2, 2}, {4, 4}}),
                   "passed different configurations", "one rank invalid");
    expect_invalid([&] { PeriodicModelAverager averager(rank == 1 ? 8 : 4, 0, pg); },
                   "ranks [0, 2, 3] have {4:4} warm-up 0; ranks [1] have {8:4} warm-up 0",
                   "periodic disagreeing");
    expect_invalid([&] { PeriodicModelAverager averager(0, 0, pg); }, "period must be >= 1, got 0",
                   "periodic period 0");
    // The group still works after all those errors.
    HierarchicalModelAverager ok({{2, 2}, {4, 4}}, 0, pg);
    Tensor p = make_param(static_cast<float>(rank));
    ok.average_parameters(std::vector<Tensor>{p});
    expect_all_equal(p, mean_of_ranks(0, 4), "after errors");
  });
  EXPECT_RANKS_OK(result);
}

// One hierarchy for every world size. kWholeGroup is the whole group; levels
// that do not fit are dropped. The kept levels average exactly as if they had been given.
class WholeGroupTest : public ::testing::TestWithParam<int> {};

TEST_P(WholeGroupTest, WholeGroupLevel_ResolvesToTheWorldAndDropsLevelsThatDoNotFit) {
  const int world = GetParam();
  auto result = run_world(world, [&](int rank, const auto& pg) {
    HierarchicalModelAverager averager({{2, 2}, {4, 4}, {8, kWholeGroup}}, 0, pg);
    using H = std::vector<std::pair<int64_t, int>>;
    const H expected = world == 1   ? H{{8, 1}}
                       : world == 2 ? H{{2, 2}}
                       : world == 4 ? H{{2, 2}, {4, 4}}
                                    : H{{2, 2}, {4, 4}, {8, world}};
    EXPECT_EQ(averager.period_group_size(), expected) << "world " << world;
    ASSERT_EQ(averager.level_stats().size(), expected.size());
    EXPECT_EQ(averager.level_groups().back().get(), pg.get());
    // Step 8: the top kept level averages over the whole group.
    Tensor p = make_param(static_cast<float>(rank));
    averager.set_step(8);
    averager.average_parameters(std::vector<Tensor>{p});
    expect_all_equal(p, mean_of_ranks(0, world), "step 8, world " + std::to_string(world));
    EXPECT_TRUE(averager.averaged_whole_group_last_step());
  });
  EXPECT_RANKS_OK(result);
}

INSTANTIATE_TEST_SUITE_P(Worlds, WholeGroupTest, ::testing::Values(1, 2, 4, 8));

TEST(HierarchicalModelAverager, WholeGroupErrors_NameTheLevelAndTheWorld) {
  auto result = run_world(3, [&](int rank, const auto& pg) {
    using H = std::vector<std::pair<int64_t, int>>;
    auto hier = [&](H levels) {
      return [=] { HierarchicalModelAverager averager(levels, 0, pg); };
    };
    // 2 does not divide the whole group of 3.
    expect_invalid(hier({{2, 2}, {8, kWholeGroup}}),
                   "group size 2 does not divide 3 ({2:2, 8:world} in a process group of 3 ranks)",
                   "non-nesting world");
    expect_invalid(hier({{2, kWholeGroup}, {8, 4}}),
                   "group size 0 (the whole group) of entry 0 must be the last entry",
                   "world not last");
    expect_invalid(hier({{2, -2}}), "group size of entry 0 must be >= 1, or 0 for the whole group",
                   "negative size");
    expect_invalid(hier({{2, 4}, {4, 8}}),
                   "every group size of {2:4, 4:8} is larger than the process group size 3",
                   "nothing fits");
    // Levels larger than the world are dropped, but a last level below it is still an error,
    // which names the entry that was given and dropped, not only the level left.
    expect_invalid(hier({{2, 2}, {4, 4}}),
                   "entry 1 (4:4) of {2:2, 4:4} does not fit in the process group of 3 ranks",
                   "top below the world");
    expect_invalid(hier({{2, 2}, {4, 4}}),
                   "leaves the last level 2:2 whose group size 2 must equal the process group "
                   "size 3",
                   "top below the world: the level left");
    (void)rank;
  });
  EXPECT_RANKS_OK(result);
}

}  // namespace
}  // namespace hsgd::distributed
