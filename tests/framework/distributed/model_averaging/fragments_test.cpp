// Streaming levels (LevelOptions::fragments, fragments.h, averagers.h): the split of the model,
// the busiest-window metric, validation, and at 2 to 4 ranks the schedule of the fragments
// against oracles computed in the test from the rule (each fragment's slice is the group mean
// of what the ranks held at its start, plus the local progress since, at its due step), the
// outer optimizer per fragment, compression with error feedback, and checkpoints.

#include "framework/distributed/model_averaging/fragments.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/distributed/model_averaging/averagers.h"
#include "framework/distributed/model_averaging/hierarchical_model_averager.h"
#include "framework/distributed/model_averaging/hierarchy_text.h"
#include "framework/distributed/model_averaging/link_peak.h"
#include "framework/distributed/model_averaging/utils.h"
#include "tests/support/world.h"

namespace hsgd::distributed {
namespace {

using hsgd::testing::run_world;
using Values = std::vector<float>;

// ---- the split and the window, in one process ----

TEST(FragmentSplit, WholeTensorsWithBalancedBytes_BuffersInTheLast) {
  using detail::Fragment;
  using detail::split_fragments;
  // Cumulative sizes 3, 8, 10, 16; cuts closest to 4, 8, 12: after tensors 1, 2, 3.
  const std::vector<int64_t> sizes = {3, 5, 2, 6};
  EXPECT_EQ(split_fragments(sizes, 0, 4, "t"),
            (std::vector<Fragment>{{0, 3, 3}, {3, 5, 5}, {8, 2, 2}, {10, 6, 6}}));
  // Two fragments: 8 is exactly half. Buffers (7 values) join the last fragment.
  EXPECT_EQ(split_fragments(sizes, 7, 2, "t"), (std::vector<Fragment>{{0, 8, 8}, {8, 15, 8}}));
  // Ten tensors of 10: three fragments of 30, 40, 30 values (cuts at 30 and 70, the values
  // closest to 33.3 and 66.7).
  const std::vector<int64_t> even(10, 10);
  EXPECT_EQ(split_fragments(even, 0, 3, "t"),
            (std::vector<Fragment>{{0, 30, 30}, {30, 40, 40}, {70, 30, 30}}));
  // A tensor larger than its share keeps its fragment large; every fragment keeps a tensor.
  const std::vector<int64_t> skewed = {100, 1, 1, 1};
  EXPECT_EQ(split_fragments(skewed, 0, 3, "t"),
            (std::vector<Fragment>{{0, 100, 100}, {100, 1, 1}, {101, 2, 2}}));
  EXPECT_EQ(split_fragments(sizes, 4, 1, "t"), (std::vector<Fragment>{{0, 20, 16}}));
}

TEST(FragmentSplit, MoreFragmentsThanTensors_NamesBoth) {
  const std::vector<int64_t> sizes = {4, 4, 4};
  try {
    detail::split_fragments(sizes, 0, 5, "HierarchicalModelAverager level 1 (8:world@fragments=5)");
    ADD_FAILURE() << "5 fragments of 3 tensors were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("HierarchicalModelAverager level 1 (8:world@fragments=5): "
                                         "fragments 5 exceed the 3 parameter tensors"),
              std::string::npos)
        << e.what();
  }
}

TEST(FragmentSplit, OffsetsStaggerTheFragmentsOverThePeriod) {
  EXPECT_EQ(detail::fragment_offset(16, 4, 0), 0);
  EXPECT_EQ(detail::fragment_offset(16, 4, 1), 4);
  EXPECT_EQ(detail::fragment_offset(16, 4, 3), 12);
  EXPECT_EQ(detail::fragment_offset(6, 4, 1), 1);  // 6 / 4 rounded down
  EXPECT_EQ(detail::fragment_offset(6, 4, 2), 3);
  EXPECT_EQ(detail::fragment_offset(6, 4, 3), 4);
}

TEST(LinkPeakTest, BusiestWindowOfSyntheticTransfers) {
  // One transfer of 1 MB over 0.5 s: any 100 ms of it holds 0.2 MB, 2 MB/s.
  detail::LinkPeak peak(0.1);
  EXPECT_EQ(peak.bytes_per_second(), 0.0);
  peak.add(10.0, 10.5, 1'000'000);
  EXPECT_NEAR(peak.bytes_per_second(), 2e6, 1e-3);
  // A short burst of 0.3 MB in 10 ms far from it: the whole burst fits in a window, 3 MB/s.
  peak.add(20.0, 20.01, 300'000);
  EXPECT_NEAR(peak.bytes_per_second(), 3e6, 1e-3);
  // 0.15 MB at once at 10.45 (inside the long transfer): [10.4, 10.5] holds 0.2 + 0.15 MB.
  peak.add(10.45, 10.45, 150'000);
  EXPECT_NEAR(peak.bytes_per_second(), 3.5e6, 1e-3);
  // Two transfers overlapping in part: [0, 0.2] with 0.4 MB and [0.15, 0.25] with 0.4 MB. The
  // window [0.15, 0.25] holds 0.1 MB of the first (2 MB/s over 0.05 s) and all of the second.
  detail::LinkPeak two(0.1);
  two.add(0.15, 0.25, 400'000);
  two.add(0.0, 0.2, 400'000);
  EXPECT_NEAR(two.bytes_per_second(), 5e6, 1e-3);
  // A restored peak is kept when the new transfers are slower.
  two.keep_at_least(9e6);
  EXPECT_NEAR(two.bytes_per_second(), 9e6, 1e-3);
  two.add(100.0, 100.0, 0);  // nothing sent: ignored
  EXPECT_NEAR(two.bytes_per_second(), 9e6, 1e-3);
}

// A long run keeps a bounded record and still sees a burst among the latest transfers.
TEST(LinkPeakTest, LongRunKeepsTheLatestTransfers) {
  detail::LinkPeak peak(0.1);
  const size_t n = 2 * detail::LinkPeak::kKept + 10;
  for (size_t i = 0; i < n; ++i) peak.add(static_cast<double>(i), i + 0.01, 1000);
  EXPECT_NEAR(peak.bytes_per_second(), 1e4, 1e-6);  // 1000 bytes in any window holding one
  // Two transfers in one window at the end: 1000 + 500 bytes.
  peak.add(n - 1 + 0.05, n - 1 + 0.05, 500);
  EXPECT_NEAR(peak.bytes_per_second(), 1.5e4, 1e-6);
}

TEST(FragmentOptions, ValidateNamesTheBadValue) {
  LevelOptions level{.period = 4, .group_size = 2, .fragments = 0};
  EXPECT_EQ(validate_options(level, 1, "who"),
            "who: level 1 (4:2@fragments=0): fragments must be >= 1, got 0");
  level.fragments = 5;
  EXPECT_EQ(validate_options(level, 1, "who"),
            "who: level 1 (4:2@fragments=5): fragments 5 must be at most the period 4 so that "
            "each fragment averages at its own step of the period");
  level.fragments = 4;
  EXPECT_EQ(validate_options(level, 1, "who"), "");
  EXPECT_FALSE(is_plain(level));
  EXPECT_FALSE(is_anchored(level));
  // Without overlap a fragment merges when the next one starts; an overlap given is kept.
  EXPECT_EQ(merge_delay(level), 1);
  EXPECT_EQ(merge_delay(LevelOptions{.period = 16, .fragments = 4}), 4);
  EXPECT_EQ(merge_delay(LevelOptions{.period = 16, .overlap_steps = 2, .fragments = 4}), 2);
  EXPECT_EQ(merge_delay(LevelOptions{.period = 16}), 0);
}

// ---- multi-rank ----

// Four parameter tensors of 3, 5, 2 and 6 values (the first split above: with F = 4 each tensor
// is a fragment); values differ per rank, tensor and element.
std::vector<Tensor> make_model(int rank, const std::vector<int64_t>& sizes = {3, 5, 2, 6}) {
  std::vector<Tensor> params;
  for (size_t t = 0; t < sizes.size(); ++t) {
    Values v(static_cast<size_t>(sizes[t]));
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = static_cast<float>(rank) * 1.5f + 0.25f * static_cast<float>(t) + 0.01f * i;
    }
    Tensor p = from_vector(v, {sizes[t]}).set_requires_grad(true);
    p.set_grad(ones({sizes[t]}));
    params.push_back(p);
  }
  return params;
}

// An optimizer step stand-in: different per rank, step, tensor and element.
void local_step(std::vector<Tensor>& params, int rank, int64_t t) {
  for (size_t k = 0; k < params.size(); ++k) {
    Values v = params[k].to_vector();
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] += 0.0625f * static_cast<float>((rank + 1) * (t % 3 + 1)) - 0.01f * k + 0.001f * i;
    }
    params[k].copy_(from_vector(v, {static_cast<int64_t>(v.size())}));
  }
}

Values flat(const std::vector<Tensor>& params) {
  Values out;
  for (const Tensor& p : params) {
    const Values v = p.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// All ranks' values, rank after rank (a collective of the test, at the same point on every
// rank).
std::vector<Values> gather(comm::ProcessGroup& pg, const Values& mine) {
  std::vector<float> all(mine.size() * static_cast<size_t>(pg.size()));
  pg.allgather(std::span<const float>(mine), std::span<float>(all), "test values")->wait();
  std::vector<Values> out;
  for (int r = 0; r < pg.size(); ++r) {
    out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(r * mine.size()),
                     all.begin() + static_cast<std::ptrdiff_t>((r + 1) * mine.size()));
  }
  return out;
}

class FragmentsTest : public ::testing::TestWithParam<int> {};

// F = 1 written out is the level without the option, bit for bit, through every option.
TEST_P(FragmentsTest, OneFragment_IsBitIdenticalToNoOption) {
  const int world = GetParam();
  auto result = run_world(world, {.local_world_size = 1}, [&](int rank, const auto& pg) {
    const std::string base = "1:1@outer=0.9,2:world@outer=0.7/0.9/nesterov,overlap=1,bf16,ef";
    HierarchicalModelAverager with(parse_hierarchy(base + ",fragments=1"), 1, pg);
    HierarchicalModelAverager without(parse_hierarchy(base), 1, pg);
    HierarchicalModelAverager plain_with(parse_hierarchy("4:world@fragments=1"), 0, pg);
    HierarchicalModelAverager plain_without({{4, world}}, 0, pg);
    std::vector<Tensor> a = make_model(rank), b = make_model(rank);
    std::vector<Tensor> c = make_model(rank), d = make_model(rank), e = make_model(rank);
    for (int64_t t = 0; t < 12; ++t) {
      for (auto* m : {&a, &b, &c, &d, &e}) local_step(*m, rank, t);
      with.average_parameters(a);
      without.average_parameters(b);
      plain_with.average_parameters(c);
      plain_without.average_parameters(d);
      // torch's utils.average_parameters every 4 steps: what a plain level is, bit for bit.
      if (t % 4 == 0) average_parameters(e, pg);
      ASSERT_EQ(flat(a), flat(b)) << "step " << t;
      ASSERT_EQ(flat(c), flat(d)) << "step " << t;
      ASSERT_EQ(flat(c), flat(e)) << "step " << t;
    }
    EXPECT_EQ(with.level_stats()[1].bytes, without.level_stats()[1].bytes);
    EXPECT_TRUE(with.state_dict().contains("levels.1.anchor"));
    EXPECT_FALSE(with.state_dict().contains("levels.1.fragments.0.anchor"));
  });
  EXPECT_RANKS_OK(result);
}

// Plain averaging in 4 fragments, period 8: fragment f starts at steps 2f (mod 8) and merges 2
// steps later (period / fragments, no overlap given) or 1 step later (overlap 1). At its due
// step, its slice on rank r is mean(S) + (x_r - S_r): S the values all ranks held when it
// started, x_r this rank's values before the call; every other slice is left as it was.
TEST_P(FragmentsTest, PlainFragments_EachSliceIsTheGroupMeanAtItsDueStep) {
  const int world = GetParam();
  auto result = run_world(world, [&](int rank, const auto& pg) {
    // The fragments of make_model(): one tensor each (FragmentSplit above).
    const std::vector<size_t> begin = {0, 3, 8, 10, 16};
    for (const int64_t overlap : {0, 1}) {
      const int64_t delay = overlap == 0 ? 2 : 1;
      PeriodicModelAverager averager(
          LevelOptions{.period = 8, .overlap_steps = overlap, .fragments = 4}, 0, pg);
      std::vector<Tensor> params = make_model(rank);
      std::vector<std::vector<Values>> started(4);  // [fragment]: every rank's S
      int merged = 0;
      for (int64_t t = 0; t < 20; ++t) {
        local_step(params, rank, t);
        const Values before = flat(params);
        const std::vector<Values> all = gather(*pg, before);
        averager.average_parameters(params);
        const Values after = flat(params);
        int due = -1;  // the fragment started `delay` steps ago
        for (int f = 0; f < 4; ++f) {
          if (t >= delay && (t - delay) % 8 == 2 * f) due = f;
        }
        for (int f = 0; f < 4; ++f) {
          for (size_t i = begin[f]; i < begin[f + 1]; ++i) {
            if (f != due) {
              ASSERT_EQ(after[i], before[i]) << "step " << t << " fragment " << f << " value " << i;
              continue;
            }
            float mean = 0;
            for (int r = 0; r < world; ++r) mean += started[f][r][i];
            mean /= static_cast<float>(world);
            const float expected = mean + (before[i] - started[f][rank][i]);
            ASSERT_NEAR(after[i], expected, 1e-5f * std::max(1.0f, std::fabs(expected)))
                << "overlap " << overlap << " step " << t << " fragment " << f << " value " << i;
          }
        }
        merged += due >= 0;
        if (t % 2 == 0) started[static_cast<size_t>(t % 8 / 2)] = all;  // starts at this step
      }
      // 10 starts (0, 2, ..., 18); with delay 2 the last one is still pending.
      EXPECT_EQ(merged, delay == 2 ? 9 : 10) << "overlap " << overlap;
      const AveragingLevelStats stats = averager.level_stats()[0];
      EXPECT_EQ(stats.calls, 10);
      // 16 values in float32, a quarter of them (4 on average) per averaging.
      EXPECT_EQ(stats.bytes, 4 * (3 + 5 + 2 + 6 + 3 + 5 + 2 + 6 + 3 + 5));
      EXPECT_GT(stats.peak_bytes_per_second, 0.0);
      EXPECT_FALSE(averager.averaged_whole_group_last_step());
    }
  });
  EXPECT_RANKS_OK(result);
}

// Each fragment of an outer-optimized level is the level of one fragment on its slice, started
// at the fragment's offset: Periodic(8, warm-up 0) with 4 fragments against Periodic(8, warm-up
// 2f) over the whole model, compared on slice f. Element-wise arithmetic, the same sums (exact
// at 2 ranks, where a sum of two values has one order).
TEST_P(FragmentsTest, OuterPerFragment_EqualsOneFragmentOnItsSlice) {
  const int world = GetParam();
  auto result = run_world(world, [&](int rank, const auto& pg) {
    const OuterOptimizer outer{.lr = 0.7, .momentum = 0.9, .nesterov = true};
    const std::vector<size_t> begin = {0, 3, 8, 10, 16};
    PeriodicModelAverager streaming(
        LevelOptions{.period = 8, .outer = outer, .overlap_steps = 2, .fragments = 4}, 0, pg);
    std::vector<std::unique_ptr<PeriodicModelAverager>> whole;
    std::vector<std::vector<Tensor>> models;
    for (int64_t f = 0; f < 4; ++f) {
      whole.push_back(std::make_unique<PeriodicModelAverager>(
          LevelOptions{.period = 8, .outer = outer, .overlap_steps = 2}, 2 * f, pg));
      models.push_back(make_model(rank));
    }
    std::vector<Tensor> params = make_model(rank);
    for (int64_t t = 0; t < 30; ++t) {
      local_step(params, rank, t);
      streaming.average_parameters(params);
      const Values got = flat(params);
      for (size_t f = 0; f < 4; ++f) {
        local_step(models[f], rank, t);
        whole[f]->average_parameters(models[f]);
        const Values want = flat(models[f]);
        for (size_t i = begin[f]; i < begin[f + 1]; ++i) {
          if (world == 2) {
            ASSERT_EQ(got[i], want[i]) << "step " << t << " fragment " << f << " value " << i;
          } else {
            ASSERT_NEAR(got[i], want[i], 1e-5f * std::max(1.0f, std::fabs(want[i])))
                << "step " << t << " fragment " << f << " value " << i;
          }
        }
      }
    }
    const StateDict state = streaming.state_dict();
    for (int f = 0; f < 4; ++f) {
      const std::string prefix = "levels.0.fragments." + std::to_string(f) + ".";
      EXPECT_TRUE(state.contains(prefix + "anchor")) << prefix;
      EXPECT_TRUE(state.contains(prefix + "outer_momentum")) << prefix;
    }
    EXPECT_FALSE(state.contains("levels.0.anchor"));
  });
  EXPECT_RANKS_OK(result);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, FragmentsTest, ::testing::Values(2, 3),
                         [](const auto& info) { return "World" + std::to_string(info.param); });

// int8 with error feedback, a rank per node (every value is rounded on the ring), 4 fragments
// under a node level: after the same local steps and a last merge, every replica is within the
// int8 rounding of the float32 run's, and each averaging sends about a quarter of the model.
TEST(FragmentsCompressed, Int8WithErrorFeedback_StaysNearTheFloatMean) {
  const int world = 4;
  auto result = run_world(world, {.local_world_size = 1}, [&](int rank, const auto& pg) {
    const std::vector<int64_t> sizes = {300, 260, 280, 310, 290};
    const auto run = [&](const std::string& hierarchy, AveragingLevelStats* stats) {
      HierarchicalModelAverager averager(parse_hierarchy(hierarchy), 0, pg);
      std::vector<Tensor> params = make_model(rank, sizes);
      for (int64_t t = 0; t < 40; ++t) {
        local_step(params, rank, t);
        averager.average_parameters(params);
      }
      averager.finish_pending(params);
      *stats = averager.level_stats()[1];
      return flat(params);
    };
    AveragingLevelStats int8_stats, float_stats, whole_stats;
    const Values int8 = run("2:2,8:world@fragments=4,int8,ef", &int8_stats);
    const Values float32 = run("2:2,8:world@fragments=4", &float_stats);
    run("2:2,8:world", &whole_stats);
    float largest = 0;
    for (const float v : float32) largest = std::max(largest, std::fabs(v));
    bool rounded = false;
    for (size_t i = 0; i < int8.size(); ++i) rounded |= int8[i] != float32[i];
    EXPECT_TRUE(rounded) << "int8 rounded nothing; the test shows nothing";
    for (size_t i = 0; i < int8.size(); ++i) {
      ASSERT_NEAR(int8[i], float32[i], 0.01f * largest) << "rank " << rank << " value " << i;
    }
    // Float32: the fragments' bytes per averaging are about a quarter of the whole model's.
    const double per_fragment = static_cast<double>(float_stats.bytes) / float_stats.calls;
    const double per_whole = static_cast<double>(whole_stats.bytes) / whole_stats.calls;
    EXPECT_NEAR(per_fragment / per_whole, 0.25, 0.05) << per_fragment << " vs " << per_whole;
    EXPECT_EQ(float_stats.calls, 4 * whole_stats.calls);
    EXPECT_GT(int8_stats.bytes, 0);
    EXPECT_LT(int8_stats.bytes, float_stats.bytes);  // int8 after each fragment's first averaging
  });
  EXPECT_RANKS_OK(result);
}

// start_from: with a common start, a compressed level's first averaging is compressed (fewer
// bytes than float32's n * 4) and still lands near the exact group mean; without it, the first
// averaging is float32 plain averaging. Ranks that start from different values are refused on
// every rank, and nothing changes.
TEST(StartFrom, CommonStartMakesTheFirstAveragingCompressed) {
  const int world = 4;
  auto result = run_world(world, {.local_world_size = 1}, [&](int rank, const auto& pg) {
    const std::vector<int64_t> sizes = {300, 260, 280, 310, 290};
    int64_t n = 0;
    for (const int64_t size : sizes) n += size;
    for (const bool common_start : {true, false}) {
      for (const std::string hierarchy : {"8:world@int8", "8:world@fragments=2,int4,ef"}) {
        HierarchicalModelAverager averager(parse_hierarchy(hierarchy), 0, pg);
        std::vector<Tensor> params = make_model(0, sizes);  // rank 0's values on every rank
        EXPECT_EQ(averager.start_from(common_start ? params : make_model(rank, sizes)),
                  common_start)
            << hierarchy;
        local_step(params, rank, 0);
        const std::vector<Values> before = gather(*pg, flat(params));
        averager.average_parameters(params);  // step 0: the first averaging (fragment 0 only)
        averager.finish_pending(params);
        const AveragingLevelStats stats = averager.level_stats()[0];
        const int64_t averaged = hierarchy.find("fragments") == std::string::npos
                                     ? n
                                     : sizes[0] + sizes[1] + sizes[2];  // fragment 0: 840 of 1440
        if (common_start) {
          // int8 or int4 values with a float32 step per block, twice through the ring of 4:
          // under 2 bytes a value against float32's 4.
          EXPECT_LT(stats.bytes, averaged * 2) << hierarchy;
        } else {
          EXPECT_EQ(stats.bytes, averaged * 4) << hierarchy;
        }
        const Values after = flat(params);
        // Rounding of the differences (at most about 0.55 here): half a step of int8's 255 or
        // int4's 15 levels per block; float32 plain averaging is exact but for summation order.
        const double tolerance = !common_start                               ? 1e-5
                                 : hierarchy.find("int4") != std::string::npos ? 0.1
                                                                               : 0.01;
        for (int64_t i = 0; i < averaged; ++i) {
          double mean = 0;
          for (const Values& v : before) mean += v[static_cast<size_t>(i)];
          mean /= world;
          ASSERT_NEAR(after[static_cast<size_t>(i)], mean, tolerance)
              << hierarchy << " value " << i << (common_start ? " (common start)" : "");
        }
      }
    }
  });
  EXPECT_RANKS_OK(result);
}

// A checkpoint in the middle of fragments in flight (outer, int8, error feedback, overlap,
// under an anchored node level) resumes bit for bit; keys per fragment.
TEST(FragmentsState, CheckpointResume_BitForBit) {
  const int world = 4;
  auto result = run_world(world, {.local_world_size = 2}, [&](int rank, const auto& pg) {
    const auto levels = parse_hierarchy(
        "1:2@outer=0.8/0.5,8:world@outer=0.7/0.9/nesterov,overlap=3,fragments=4,"
        "int8,ef");
    HierarchicalModelAverager original(levels, 0, pg);
    std::vector<Tensor> p = make_model(rank, {40, 30, 50, 20, 60});
    for (int64_t t = 0; t < 19; ++t) {  // 18 started fragment 1, in flight until 21
      local_step(p, rank, t);
      original.average_parameters(p);
    }
    ASSERT_TRUE(original.has_pending());
    const StateDict state = original.state_dict();
    EXPECT_TRUE(state.contains("levels.1.fragments.1.pending.snapshot"));
    EXPECT_TRUE(state.contains("levels.1.fragments.3.anchor"));
    EXPECT_TRUE(state.contains("levels.1.fragments.0.outer_momentum"));
    EXPECT_TRUE(state.contains("levels.1.peak_bytes_per_second"));
    EXPECT_FALSE(state.contains("levels.1.anchor"));
    if (rank % 2 == 0) {  // node leaders keep the residuals
      EXPECT_TRUE(state.contains("levels.1.fragments.2.residual"));
    }
    HierarchicalModelAverager resumed(levels, 0, pg);
    resumed.load_state_dict(state);
    EXPECT_EQ(resumed.step(), 19);
    EXPECT_TRUE(resumed.has_pending());
    EXPECT_EQ(resumed.level_stats()[1].calls, original.level_stats()[1].calls);
    EXPECT_GE(resumed.level_stats()[1].peak_bytes_per_second,
              original.level_stats()[1].peak_bytes_per_second);
    std::vector<Tensor> q = make_model(rank, {40, 30, 50, 20, 60});
    for (size_t k = 0; k < p.size(); ++k) q[k].copy_(p[k]);
    for (int64_t t = 19; t < 45; ++t) {
      local_step(p, rank, t);
      local_step(q, rank, t);
      original.average_parameters(p);
      resumed.average_parameters(q);
      ASSERT_EQ(flat(p), flat(q)) << "step " << t;
    }
  });
  EXPECT_RANKS_OK(result);
}

// Bad fragment counts fail on every rank, naming the value: at construction (fragments 0, more
// than the period), and at the first averaging when the model has fewer tensors.
TEST(FragmentsValidation, BadCountsThrowOnEveryRank) {
  auto result = run_world(2, [&](int, const auto& pg) {
    const auto expect_invalid = [](const std::function<void()>& body, const std::string& part) {
      try {
        body();
        ADD_FAILURE() << "accepted; expected: " << part;
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      }
    };
    expect_invalid(
        [&] { HierarchicalModelAverager a(parse_hierarchy("8:world@fragments=0"), 0, pg); },
        "level 0 (8:world@fragments=0): fragments must be >= 1, got 0");
    expect_invalid(
        [&] { PeriodicModelAverager a(LevelOptions{.period = 2, .fragments = 3}, 0, pg); },
        "fragments 3 must be at most the period 2");
    PeriodicModelAverager averager(LevelOptions{.period = 8, .fragments = 8}, 0, pg);
    std::vector<Tensor> params = make_model(pg->rank());
    expect_invalid([&] { averager.average_parameters(params); },
                   "fragments 8 exceed the 4 parameter tensors with a gradient");
  });
  EXPECT_RANKS_OK(result);
}

}  // namespace
}  // namespace hsgd::distributed
