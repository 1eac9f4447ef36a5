// Level options of the averagers: outer optimizer, overlap, compression, their state
// in state_dict and their validation, at 2, 3 and 4 ranks. Exact semantics are checked against
// closed forms computed by hand and against reference_averager.h (every rank's state simulated
// in one process from the rule written in averaging_level.h and averagers.h).

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/error.h"
#include "comm/log.h"
#include "framework/distributed/model_averaging/averagers.h"
#include "framework/distributed/model_averaging/compression.h"
#include "framework/distributed/model_averaging/hierarchical_model_averager.h"
#include "tests/framework/distributed/dist_test_util.h"
#include "tests/framework/distributed/model_averaging/reference_averager.h"
#include "tests/support/log_capture.h"
#include "tests/support/world.h"

namespace hsgd::distributed {
namespace {

using hsgd::testing::run_world;
using Values = std::vector<float>;
constexpr size_t kNumel = 3;

Tensor make_param(const Values& values) {
  Tensor p = from_vector(values, {static_cast<int64_t>(values.size())}).set_requires_grad(true);
  p.set_grad(ones({static_cast<int64_t>(values.size())}));
  return p;
}

Values initial_values(int rank) {
  Values x(kNumel);
  for (size_t i = 0; i < kNumel; ++i) x[i] = static_cast<float>(rank) + 0.1f * i;
  return x;
}

// The local step of rank r at step t (an optimizer step stand-in): different per rank, step and
// element, so that a merge with the wrong snapshot or the wrong group shows.
void local_step(Values& x, int rank, int64_t t) {
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] += 0.125f * static_cast<float>(rank + 1) * static_cast<float>(t % 3 + 1) + 0.01f * i;
  }
}

void add_local_step(Tensor& p, int rank, int64_t t) {
  Values x = p.to_vector();
  local_step(x, rank, t);
  p.copy_(from_vector(x, {static_cast<int64_t>(x.size())}));
}

void expect_near_values(const Values& actual, const Values& expected, float tolerance,
                        const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], tolerance * std::max(1.0f, std::fabs(expected[i])))
        << what << " element " << i;
  }
}

int hierarchical_level(const std::vector<LevelOptions>& levels, int64_t warmup, int64_t t) {
  if (t < warmup) return -1;
  for (int i = static_cast<int>(levels.size()) - 1; i >= 0; --i) {
    if (t % levels[i].period == 0) return i;
  }
  return -1;
}

// Runs `steps` steps of local_step + averager.average_parameters on this rank and the reference
// for every rank; after every step this rank's parameters must match the reference.
void check_against_reference(ModelAverager& averager, const std::vector<LevelOptions>& levels,
                             int rank, int world, int64_t steps, float tolerance,
                             const std::function<int(int64_t)>& level_at) {
  std::vector<int> node_sizes;  // the layout the averager's compressed levels see
  for (const auto& node : comm::gather_node_layout(*averager.process_group()).nodes()) {
    node_sizes.push_back(static_cast<int>(node.size()));
  }
  testing::ReferenceAverager reference(levels, world, node_sizes);
  std::vector<Values> xs;
  for (int r = 0; r < world; ++r) xs.push_back(initial_values(r));
  Tensor param = make_param(initial_values(rank));
  for (int64_t t = 0; t < steps; ++t) {
    add_local_step(param, rank, t);
    for (int r = 0; r < world; ++r) local_step(xs[r], r, t);
    averager.average_parameters(std::vector<Tensor>{param});
    reference.step(t, level_at(t), xs);
    expect_near_values(param.to_vector(), xs[rank], tolerance,
                       "rank " + std::to_string(rank) + " step " + std::to_string(t));
  }
}

class LevelOptionsTest : public ::testing::TestWithParam<int> {};

TEST_P(LevelOptionsTest, OuterLr1Momentum0_EqualsPlainAveraging) {
  const int world = GetParam();
  auto result = run_world(world, [&](int rank, const auto& pg) {
    HierarchicalModelAverager outer(
        {LevelOptions{.period = 3, .group_size = world, .outer = OuterOptimizer{.lr = 1.0}}}, 2,
        pg);
    HierarchicalModelAverager plain({{3, world}}, 2, pg);
    Tensor a = make_param(initial_values(rank)), b = make_param(initial_values(rank));
    for (int64_t t = 0; t < 19; ++t) {
      add_local_step(a, rank, t);
      add_local_step(b, rank, t);
      outer.average_parameters(std::vector<Tensor>{a});
      plain.average_parameters(std::vector<Tensor>{b});
      expect_near_values(a.to_vector(), b.to_vector(), 1e-6f, "step " + std::to_string(t));
    }
    EXPECT_EQ(outer.level_stats()[0].calls, plain.level_stats()[0].calls);
    EXPECT_EQ(outer.level_stats()[0].bytes, plain.level_stats()[0].bytes);
    EXPECT_TRUE(outer.averaged_whole_group_last_step());  // step 18 averaged the world
  });
  EXPECT_RANKS_OK(result);
}

TEST_P(LevelOptionsTest, OuterNesterov_MatchesClosedForm) {
  // Scalar model, x_r = r at the start, x_r += r + 1 at every step, averaging every 2 steps with
  // outer SGD(lr 0.5, momentum 0.9, nesterov). Step 0 is the first averaging: plain, the anchor
  // A = mean(2r + 1) = W. After that each averaging sees the pseudo-gradient
  // D = mean(A - x) = -2 mean(r + 1) = -(W + 1), so (torch.optim.SGD):
  //   M_1 = D, M_k = 0.9 M_(k-1) + D;  A += -0.5 (D + 0.9 M_k).
  const int world = GetParam();
  auto result = run_world(world, [&](int rank, const auto& pg) {
    PeriodicModelAverager averager(
        LevelOptions{.period = 2,
                     .outer = OuterOptimizer{.lr = 0.5, .momentum = 0.9, .nesterov = true}},
        0, pg);
    Tensor p = make_param({static_cast<float>(rank)});
    double anchor = world, momentum = 0;
    const double d = -(world + 1);
    for (int64_t t = 0; t < 12; ++t) {
      p.copy_(from_vector({p.to_vector()[0] + static_cast<float>(rank + 1)}, {1}));
      averager.average_parameters(std::vector<Tensor>{p});
      if (t % 2 != 0) continue;
      if (t >= 2) {
        momentum = t == 2 ? d : 0.9 * momentum + d;
        anchor += -0.5 * (d + 0.9 * momentum);
      }
      EXPECT_NEAR(p.to_vector()[0], anchor, 1e-4 * std::abs(anchor)) << "step " << t;
      // By hand at 2 ranks: A = 2 after step 0; at step 2, D = -3, M = -3,
      // A = 2 - 0.5 (-3 - 2.7) = 4.85.
      if (world == 2 && t == 2) {
        EXPECT_NEAR(p.to_vector()[0], 4.85f, 1e-6);
      }
    }
  });
  EXPECT_RANKS_OK(result);
}

TEST_P(LevelOptionsTest, Overlap_PeriodicMatchesReference) {
  const int world = GetParam();
  auto result = run_world(world, [&](int rank, const auto& pg) {
    // k = 1, 2 within the period 4; k = 4 merges exactly when the next averaging starts; k = 6
    // reaches past the next averaging, which then waits for it first.
    for (int64_t k : {1, 2, 4, 6}) {
      const LevelOptions level{.period = 4, .group_size = world, .overlap_steps = k};
      PeriodicModelAverager averager(level, 3, pg);
      check_against_reference(averager, {level}, rank, world, 20, 1e-5f,
                              [](int64_t t) { return t >= 3 && (t - 3) % 4 == 0 ? 0 : -1; });
      EXPECT_TRUE(averager.has_pending()) << "k " << k << ": step 19 started at 15";
      EXPECT_EQ(averager.level_stats()[0].calls, 5) << "k " << k;
      EXPECT_FALSE(averager.averaged_whole_group_last_step()) << "k " << k;
    }
  });
  EXPECT_RANKS_OK(result);
}

TEST_P(LevelOptionsTest, Overlap_HandComputedFirstMerge) {
  // Overlap 2, period 10: the averaging started at step 0 from S_r = x_r(0) merges at step 2:
  // x_r = mean(S) + (x_r(2) - S_r). With x_r(0) = r + 0.125 (r + 1) (one local step), the local
  // progress of steps 1 and 2 is 0.125 (r + 1) (2 + 3).
  const int world = GetParam();
  auto result = run_world(world, [&](int rank, const auto& pg) {
    PeriodicModelAverager averager(LevelOptions{.period = 10, .overlap_steps = 2}, 0, pg);
    Tensor p = make_param(initial_values(rank));
    float mean_s = 0;
    for (int r = 0; r < world; ++r) mean_s += static_cast<float>(r) + 0.125f * (r + 1);
    mean_s /= static_cast<float>(world);
    for (int64_t t = 0; t < 3; ++t) {
      add_local_step(p, rank, t);
      averager.average_parameters(std::vector<Tensor>{p});
      const float local = static_cast<float>(rank) + 0.125f * (rank + 1) *
                                                         (t == 0   ? 1
                                                          : t == 1 ? 3
                                                                   : 6);
      const float expected = t < 2 ? local : mean_s + 0.125f * (rank + 1) * 5;
      EXPECT_NEAR(p.to_vector()[0], expected, 1e-5) << "step " << t;
    }
    EXPECT_FALSE(averager.has_pending());
  });
  EXPECT_RANKS_OK(result);
}

TEST_P(LevelOptionsTest, Overlap_FinishRightAfterAWorldStartLeavesEqualReplicas) {
  // started_whole_group_averaging_last_step() names the steps that start a world averaging
  // (overlapped: nothing merged yet); finish_pending() right then leaves every replica at the
  // group mean of the values at that step, as an averaging without overlap would (what an
  // elastic join relies on). A pair level below (world 4) must not count as the world.
  const int world = GetParam();
  auto result = run_world(world, [&](int rank, const auto& pg) {
    std::vector<LevelOptions> levels = {{.period = 4, .group_size = world, .overlap_steps = 2}};
    if (world == 4) {
      levels.insert(levels.begin(), LevelOptions{.period = 1, .group_size = 2, .overlap_steps = 1});
    }
    HierarchicalModelAverager averager(levels, 1, pg);
    Tensor p = make_param(initial_values(rank));
    for (int64_t t = 0; t < 9; ++t) {
      add_local_step(p, rank, t);
      const Values before = p.to_vector();
      averager.average_parameters(std::vector<Tensor>{p});
      const bool world_start = t >= 1 && t % 4 == 0;
      EXPECT_EQ(averager.started_whole_group_averaging_last_step(), world_start) << "step " << t;
      EXPECT_FALSE(averager.averaged_whole_group_last_step()) << "step " << t;
      if (t != 4) continue;
      // The values every rank averaged: its own at this step, after the pair level's merges.
      std::vector<float> all(kNumel * static_cast<size_t>(world));
      pg->allgather(std::span<const float>(before), std::span<float>(all), "test values")->wait();
      ASSERT_TRUE(averager.has_pending());
      averager.finish_pending(std::vector<Tensor>{p});
      EXPECT_FALSE(averager.has_pending());
      const Values mine = p.to_vector();
      std::vector<float> after(kNumel * static_cast<size_t>(world));
      pg->allgather(std::span<const float>(mine), std::span<float>(after), "test result")->wait();
      for (int r = 0; r < world; ++r) {
        for (size_t i = 0; i < kNumel; ++i) {
          EXPECT_EQ(after[r * kNumel + i], mine[i]) << "rank " << r << " element " << i;
        }
      }
      if (world == 4) continue;  // the pair level merged into `before` on the way
      for (size_t i = 0; i < kNumel; ++i) {
        float mean = 0;
        for (int r = 0; r < world; ++r) mean += all[r * kNumel + i];
        EXPECT_NEAR(mine[i], mean / static_cast<float>(world), 1e-6f) << "element " << i;
      }
    }
  });
  EXPECT_RANKS_OK(result);
}

TEST_P(LevelOptionsTest, Compression_MatchesReferenceAndCountsBytes) {
  const int world = GetParam();
  // A rank per node (a 16-bit ring over all ranks); then 2 nodes, {0, 1} and the rest (float32
  // within a node, 16-bit between the node leaders 0 and 2), or one node at 2 ranks (float32
  // only, nothing rounded).
  const std::vector<hsgd::testing::WorldOptions> layouts = {
      {.local_world_size = 1},
      world == 2 ? hsgd::testing::WorldOptions{.local_world_size = 2}
                 : hsgd::testing::WorldOptions{.node_sizes = {2, world - 2}}};
  for (size_t layout = 0; layout < layouts.size(); ++layout) {
    auto result = run_world(world, layouts[layout], [&](int rank, const auto& pg) {
      const std::vector<LevelOptions> cases = {
          {.period = 2, .group_size = world, .compression = Compression::kBF16},
          {.period = 2,
           .group_size = world,
           .compression = Compression::kBF16,
           .error_feedback = true},
          {.period = 2,
           .group_size = world,
           .compression = Compression::kFP16,
           .compression_scale = 64.0f,
           .error_feedback = true},
      };
      // 8 averagings: the first in float32 (sets the anchor, 3 values), then 7 over N nodes,
      // in which a leader sends 2 (N - 1) chunks of ceil(3 / N) values (one int64 word each).
      const int nodes = layout == 0 ? world : world == 2 ? 1 : 2;
      const bool leader = layout == 0 || rank % 2 == 0;
      const int64_t compressed = nodes == 1 || !leader ? 0 : 2 * (nodes - 1) * 8;
      for (const LevelOptions& level : cases) {
        PeriodicModelAverager averager(level, 0, pg);
        check_against_reference(averager, {level}, rank, world, 16, 1e-6f,
                                [](int64_t t) { return t % 2 == 0 ? 0 : -1; });
        const AveragingLevelStats& stats = averager.level_stats()[0];
        EXPECT_EQ(stats.calls, 8) << describe(level) << " layout " << layout;
        EXPECT_EQ(stats.bytes, 3 * 4 + 7 * compressed) << describe(level) << " layout " << layout;
        EXPECT_FALSE(averager.averaged_whole_group_last_step());  // step 15 does not average
      }
    });
    EXPECT_RANKS_OK(result) << "layout " << layout;
  }
}

TEST_P(LevelOptionsTest, AllOptionsOnOneLevel_MatchesReference) {
  const int world = GetParam();
  auto result = run_world(world, [&](int rank, const auto& pg) {
    const LevelOptions level{.period = 3,
                             .group_size = world,
                             .outer = OuterOptimizer{.lr = 0.7, .momentum = 0.9, .nesterov = true},
                             .overlap_steps = 2,
                             .compression = Compression::kBF16,
                             .error_feedback = true};
    HierarchicalModelAverager averager({level}, 1, pg);
    check_against_reference(averager, {level}, rank, world, 25, 1e-5f,
                            [](int64_t t) { return t >= 1 && t % 3 == 0 ? 0 : -1; });
  });
  EXPECT_RANKS_OK(result);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, LevelOptionsTest, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "World" + std::to_string(info.param); });

// Hierarchies mixing options across and within levels, against the reference.
// A rank per node, and 2 nodes of 2 (then the compressed pairs are within a node and sum in
// float32, the compressed top level rounds between the 2 node leaders).
class LevelOptionsHierarchyTest : public ::testing::TestWithParam<int> {};

TEST_P(LevelOptionsHierarchyTest, MixedLevels_MatchReference) {
  const int world = 4;
  auto result = run_world(world, {.local_world_size = GetParam()}, [&](int rank, const auto& pg) {
    const std::vector<std::vector<LevelOptions>> hierarchies = {
        // Anchored lower level, overlapped compressed DiLoCo on top (overlap 4 < period 6).
        {{.period = 2,
          .group_size = 2,
          .outer = OuterOptimizer{.lr = 0.8, .momentum = 0.5},
          .overlap_steps = 1},
         {.period = 6,
          .group_size = 4,
          .outer = OuterOptimizer{.lr = 0.7, .momentum = 0.9, .nesterov = true},
          .overlap_steps = 4,
          .compression = Compression::kBF16,
          .error_feedback = true}},
        // Overlapped lower level whose overlap reaches past the top level's averaging (which
        // completes it first); plain top level resetting the anchored... plain lower here.
        {{.period = 1, .group_size = 2, .overlap_steps = 3},
         {.period = 4, .group_size = 4, .outer = OuterOptimizer{.lr = 0.6}}},
        // Anchored lower level under a plain top level: the top resets its anchor.
        {{.period = 2, .group_size = 2, .outer = OuterOptimizer{.lr = 0.5, .momentum = 0.9}},
         {.period = 5, .group_size = 4}},
        // Three levels: fp16 pairs, overlapped fours... with a one-rank bottom level (outer only).
        {{.period = 1, .group_size = 1, .outer = OuterOptimizer{.lr = 0.9}},
         {.period = 2,
          .group_size = 2,
          .compression = Compression::kFP16,
          .compression_scale = 256.0f},
         {.period = 6, .group_size = 4, .overlap_steps = 7}},
    };
    for (const auto& levels : hierarchies) {
      HierarchicalModelAverager averager(levels, 1, pg);
      check_against_reference(averager, levels, rank, world, 30, 2e-5f,
                              [&](int64_t t) { return hierarchical_level(levels, 1, t); });
    }
  });
  EXPECT_RANKS_OK(result);
}

INSTANTIATE_TEST_SUITE_P(NodeLayouts, LevelOptionsHierarchyTest, ::testing::Values(1, 2),
                         [](const auto& info) { return "PerNode" + std::to_string(info.param); });

TEST(LevelOptionsHierarchy, TwoRanks_OneRankLevelBelowOverlappedFp16) {
  const int world = 2;
  auto result = run_world(world, [&](int rank, const auto& pg) {
    const std::vector<LevelOptions> levels = {
        {.period = 1, .group_size = 1, .outer = OuterOptimizer{.lr = 0.5, .momentum = 0.9}},
        {.period = 4,
         .group_size = 2,
         .overlap_steps = 2,
         .compression = Compression::kFP16,
         .compression_scale = 1024.0f}};
    HierarchicalModelAverager averager(levels, 0, pg);
    check_against_reference(averager, levels, rank, world, 21, 2e-5f,
                            [&](int64_t t) { return hierarchical_level(levels, 0, t); });
  });
  EXPECT_RANKS_OK(result);
}

// Runs a mixed-options averager, saves its state in the middle of an overlapped averaging, and
// checks that a new averager loaded from it continues exactly as the original does.
void check_state_dict_round_trip(int world, const hsgd::testing::WorldOptions& layout) {
  auto result = run_world(world, layout, [&](int rank, const auto& pg) {
    const std::vector<LevelOptions> levels =
        world % 2 == 0
            ? std::vector<LevelOptions>{{.period = 2,
                                         .group_size = 2,
                                         .outer = OuterOptimizer{.lr = 0.8, .momentum = 0.5},
                                         .overlap_steps = 1},
                                        {.period = 6,
                                         .group_size = world,
                                         .outer =
                                             OuterOptimizer{
                                                 .lr = 0.7, .momentum = 0.9, .nesterov = true},
                                         .overlap_steps = 3,
                                         .compression = Compression::kBF16,
                                         .error_feedback = true}}
            : std::vector<LevelOptions>{
                  {.period = 3,
                   .group_size = world,
                   .outer = OuterOptimizer{.lr = 0.7, .momentum = 0.9, .nesterov = true},
                   .overlap_steps = 2,
                   .compression = Compression::kBF16,
                   .error_feedback = true}};
    HierarchicalModelAverager original(levels, 0, pg);
    Tensor p = make_param(initial_values(rank));
    for (int64_t t = 0; t < 13; ++t) {  // 12 starts the top level's averaging, due at 14 / 15
      add_local_step(p, rank, t);
      original.average_parameters(std::vector<Tensor>{p});
    }
    ASSERT_TRUE(original.has_pending());
    const StateDict state = original.state_dict();
    const std::string top = "levels." + std::to_string(levels.size() - 1) + ".";
    EXPECT_TRUE(state.contains(top + "pending.snapshot"));
    EXPECT_TRUE(state.contains(top + "anchor"));
    EXPECT_TRUE(state.contains(top + "outer_momentum"));
    EXPECT_TRUE(state.contains(top + "residual"));

    HierarchicalModelAverager resumed(levels, 0, pg);
    resumed.load_state_dict(state);
    EXPECT_EQ(resumed.step(), 13);
    EXPECT_TRUE(resumed.has_pending());
    Tensor q = make_param(p.to_vector());
    for (int64_t t = 13; t < 30; ++t) {
      add_local_step(p, rank, t);
      add_local_step(q, rank, t);
      original.average_parameters(std::vector<Tensor>{p});
      resumed.average_parameters(std::vector<Tensor>{q});
      EXPECT_EQ(p.to_vector(), q.to_vector()) << "step " << t;
    }
    // A state without the level entries (e.g. only "step") drops them: the next averaging of
    // an anchored level is a first one again.
    StateDict only_step;
    only_step.set("step", int64_t{30});
    resumed.load_state_dict(only_step);
    EXPECT_FALSE(resumed.has_pending());
    EXPECT_FALSE(resumed.state_dict().contains(top + "anchor"));
  });
  EXPECT_RANKS_OK(result);
}

// Uneven nodes {0, 1} and {2}; a rank per node; 2 nodes of 2.
TEST(LevelOptionsState, StateDictRoundTripMidOverlap_World3) {
  check_state_dict_round_trip(3, {.node_sizes = {2, 1}});
}
TEST(LevelOptionsState, StateDictRoundTripMidOverlap_World4) {
  check_state_dict_round_trip(4, {.local_world_size = 1});
}
TEST(LevelOptionsState, StateDictRoundTripMidOverlap_World4TwoNodes) {
  check_state_dict_round_trip(4, {.local_world_size = 2});
}

// The settled state (what an elastic run carries to its next generation) holds the rank's
// error-feedback residual only while no averaging is pending; loaded into a new averager at such
// a step, it continues exactly as the original, residual included.
TEST(LevelOptionsState, SettledState_HoldsTheResidualOnlyWhenNothingIsPending) {
  const int world = 4;
  auto result = run_world(world, {.local_world_size = 1}, [&](int rank, const auto& pg) {
    const std::vector<LevelOptions> levels = {
        {.period = 3,
         .group_size = world,
         .outer = OuterOptimizer{.lr = 0.7, .momentum = 0.9, .nesterov = true},
         .overlap_steps = 1,
         .compression = Compression::kBF16,
         .error_feedback = true}};
    HierarchicalModelAverager original(levels, 0, pg);
    Tensor p = make_param(initial_values(rank));
    bool saw_pending = false;
    bool saw_settled = false;
    for (int64_t t = 0; t < 11; ++t) {
      add_local_step(p, rank, t);
      original.average_parameters(std::vector<Tensor>{p});
      const StateDict settled = original.settled_level_state(0);
      if (t < 3) continue;  // before the second averaging the residual does not exist
      if (original.has_pending()) {
        saw_pending = true;
        EXPECT_FALSE(settled.contains("levels.0.residual")) << "step " << t;
        EXPECT_TRUE(settled.contains("levels.0.anchor")) << "step " << t;
      } else {
        saw_settled = true;
        ASSERT_TRUE(settled.contains("levels.0.residual")) << "step " << t;
        EXPECT_EQ(settled.get_tensor("levels.0.residual").to_vector(),
                  original.state_dict().get_tensor("levels.0.residual").to_vector())
            << "step " << t;
      }
    }
    ASSERT_TRUE(saw_pending && saw_settled);
    ASSERT_FALSE(original.has_pending());  // step 11 merged the averaging started at 10
    StateDict state = original.settled_level_state(0);
    bool rounded = false;
    for (const float e : state.get_tensor("levels.0.residual").to_vector()) rounded |= e != 0.0f;
    EXPECT_TRUE(rounded) << "no rounding error was kept back; the test shows nothing";
    state.set("step", original.step());
    HierarchicalModelAverager carried(levels, 0, pg);
    carried.load_state_dict(state);
    Tensor q = make_param(p.to_vector());
    for (int64_t t = 11; t < 25; ++t) {
      add_local_step(p, rank, t);
      add_local_step(q, rank, t);
      original.average_parameters(std::vector<Tensor>{p});
      carried.average_parameters(std::vector<Tensor>{q});
      ASSERT_EQ(p.to_vector(), q.to_vector()) << "step " << t;
    }
  });
  EXPECT_RANKS_OK(result);
}

// A lower level's first averaging does not queue behind a higher level's overlapped averaging
// in flight. Rank 3 calls the averager kLate after the others. Ranks 0-2 start the world
// level's overlapped averaging only once rank 3 arrived (the first call's tensor check over the
// world waits for it), so at step 1 the pair level's averaging over {0, 1} has nothing to wait
// for. Were the check made lazily at the first plain averaging, it would queue on the world
// group behind the averaging in flight and ranks 0 and 1 would wait about kLate at step 1.
TEST(LevelOptionsSchedule, LowerLevelsFirstAveragingDoesNotWaitForAHigherOneInFlight) {
  constexpr auto kLate = std::chrono::milliseconds(2000);
  auto result = run_world(4, [&](int rank, const auto& pg) {
    const std::vector<LevelOptions> levels = {
        {.period = 1, .group_size = 2},
        {.period = 4, .group_size = 4, .outer = OuterOptimizer{.lr = 1.0}, .overlap_steps = 2}};
    HierarchicalModelAverager averager(levels, 0, pg);
    Tensor p = make_param(initial_values(rank));
    add_local_step(p, rank, 0);
    if (rank == 3) std::this_thread::sleep_for(kLate);
    averager.average_parameters(std::vector<Tensor>{p});  // step 0: the world level starts
    add_local_step(p, rank, 1);
    const auto start = std::chrono::steady_clock::now();
    averager.average_parameters(std::vector<Tensor>{p});  // step 1: the pair level
    const auto waited = std::chrono::steady_clock::now() - start;
    EXPECT_LT(waited, kLate / 2) << "rank " << rank << ": the pair level's averaging at step 1 "
                                 << "waited for the world level's averaging in flight";
    averager.finish_pending(std::vector<Tensor>{p});
  });
  EXPECT_RANKS_OK(result);
}

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

TEST(LevelOptionsValidation, BadOptions_FailOnEveryRankNamingLevelAndValue) {
  const int world = 4;
  auto result = run_world(world, [&](int rank, const auto& pg) {
    using L = std::vector<LevelOptions>;
    auto hier = [&](L levels) {
      return [=] { HierarchicalModelAverager averager(levels, 0, pg); };
    };
    const LevelOptions pairs{.period = 2, .group_size = 2};
    expect_invalid(hier({pairs, {.period = 4, .group_size = 4, .overlap_steps = -1}}),
                   "level 1 (4:4@overlap=-1): overlap_steps must be >= 0, got -1", "overlap");
    expect_invalid(hier({{.period = 2, .group_size = 2, .outer = OuterOptimizer{.lr = 0}}, {4, 4}}),
                   "level 0 (2:2@outer=0/0): outer lr must be > 0 and finite, got 0", "lr 0");
    expect_invalid(
        hier({pairs, {.period = 4, .group_size = 4, .outer = OuterOptimizer{.lr = -0.5}}}),
        "level 1 (4:4@outer=-0.5/0): outer lr must be > 0 and finite, got -0.5", "lr < 0");
    expect_invalid(hier({{.period = 2, .group_size = 1, .compression = Compression::kBF16},
                         {.period = 4, .group_size = 4}}),
                   "level 0 (2:1@bf16): compression bf16 needs a group of at least 2 ranks, got "
                   "group size 1",
                   "compression on one rank");
    expect_invalid(
        hier({pairs, {.period = 4, .group_size = 4, .outer = OuterOptimizer{.momentum = -1}}}),
        "outer momentum must be >= 0 and finite, got -1", "momentum");
    expect_invalid(
        hier({pairs, {.period = 4, .group_size = 4, .outer = OuterOptimizer{.nesterov = true}}}),
        "outer nesterov needs a momentum > 0", "nesterov");
    expect_invalid(hier({pairs, {.period = 4, .group_size = 4, .error_feedback = true}}),
                   "error_feedback needs a compression", "error feedback");
    expect_invalid(hier({pairs,
                         {.period = 4,
                          .group_size = 4,
                          .compression = Compression::kFP16,
                          .compression_scale = 0}}),
                   "compression_scale must be > 0 and finite, got 0", "scale");
    expect_invalid(
        [&] { PeriodicModelAverager a(LevelOptions{.period = 2, .group_size = 2}, 0, pg); },
        "group_size must be 0 or the process group size 4, got 2", "periodic size");
    expect_invalid(
        [&] { PeriodicModelAverager a(LevelOptions{.period = 2, .overlap_steps = -3}, 0, pg); },
        "PeriodicModelAverager: level 0 (2:4@overlap=-3): overlap_steps must be >= 0, got -3",
        "periodic overlap");
    // The cross-rank check covers the options: rank 2 has another outer lr, rank 3 bf16.
    LevelOptions top{.period = 4, .group_size = 4, .outer = OuterOptimizer{.lr = 0.7}};
    if (rank == 2) top.outer->lr = 0.5;
    if (rank == 3) top.compression = Compression::kBF16;
    expect_invalid(hier({pairs, top}),
                   "ranks [0, 1] have {2:2, 4:4@outer=0.7/0} warm-up 0; ranks [2] have {2:2, "
                   "4:4@outer=0.5/0} warm-up 0; ranks [3] have {2:2, 4:4@outer=0.7/0,bf16} "
                   "warm-up 0",
                   "disagreeing options");
    // Only a bit of the scale differs: still caught.
    LevelOptions scaled{.period = 4,
                        .compression = Compression::kFP16,
                        .compression_scale = rank == 1 ? 1024.0f : std::nextafter(1024.0f, 2e3f)};
    expect_invalid([&] { PeriodicModelAverager a(scaled, 0, pg); },
                   "passed different configurations", "scale bits");
    // The group still works afterwards.
    HierarchicalModelAverager ok(
        {pairs, {.period = 4, .group_size = 4, .outer = OuterOptimizer{.lr = 1}}}, 0, pg);
    Tensor p = make_param({static_cast<float>(rank)});
    ok.average_parameters(std::vector<Tensor>{p});
    EXPECT_FLOAT_EQ(p.to_vector()[0], 1.5f);
  });
  EXPECT_RANKS_OK(result);
}

using hsgd::testing::LogCapture;

// Options that a configuration accepts but cannot apply are named in a warning: on a level that
// was dropped, compression where nothing crosses a node, an overlap longer than the period.
TEST(LevelOptionsIneffective, DroppedLevelsOptions_AreNamed) {
  auto result = run_world(2, [&](int rank, const auto& pg) {
    LogCapture log;
    // 2:2 already covers the 2 ranks: the world level, with its outer optimizer, is dropped.
    HierarchicalModelAverager averager(
        {LevelOptions{.period = 2, .group_size = 2},
         LevelOptions{.period = 8, .outer = OuterOptimizer{.lr = 0.7, .momentum = 0.9}}},
        0, pg);
    EXPECT_EQ(averager.level_options().size(), 1u);
    if (rank == 0) {
      EXPECT_NE(log.text().find("the options outer=0.7/0.9 of the dropped level "
                                "8:world@outer=0.7/0.9 are not applied; the top level kept is 2:2"),
                std::string::npos)
          << log.text();
    }
  });
  EXPECT_RANKS_OK(result);
}

TEST(LevelOptionsIneffective, OverlapLongerThanThePeriod_IsNamed) {
  auto result = run_world(2, [&](int rank, const auto& pg) {
    LogCapture log;
    PeriodicModelAverager averager(LevelOptions{.period = 2, .overlap_steps = 5}, 0, pg);
    if (rank == 0) {
      EXPECT_NE(log.text().find("PeriodicModelAverager level 0 (2:2@overlap=5): overlap_steps 5 "
                                "exceeds the period 2"),
                std::string::npos)
          << log.text();
    }
  });
  EXPECT_RANKS_OK(result);
}

// A compressed level whose group is on one node averages in float32 and says so; alone (the
// whole group is one rank) it averages as the same level without compression instead of
// dereferencing a 16-bit averaging it never made.
TEST(LevelOptionsIneffective, CompressionWithinOneNode_IsNamedAndAveragesInFloat32) {
  for (const int world : {1, 2}) {
    auto result = run_world(world, [&](int rank, const auto& pg) {
      LogCapture log;
      const LevelOptions top{.period = 2,
                             .outer = OuterOptimizer{.lr = 0.5, .momentum = 0.9},
                             .compression = Compression::kBF16,
                             .error_feedback = true};
      LevelOptions plain_top = top;
      plain_top.compression = Compression::kNone;
      plain_top.error_feedback = false;
      HierarchicalModelAverager compressed({top}, 0, pg);
      HierarchicalModelAverager float32({plain_top}, 0, pg);
      Tensor a = make_param(initial_values(rank)), b = make_param(initial_values(rank));
      for (int64_t t = 0; t < 7; ++t) {
        add_local_step(a, rank, t);
        add_local_step(b, rank, t);
        compressed.average_parameters(std::vector<Tensor>{a});
        float32.average_parameters(std::vector<Tensor>{b});
        EXPECT_EQ(a.to_vector(), b.to_vector()) << "world " << world << " step " << t;
      }
      if (rank == 0) {
        EXPECT_NE(log.text().find(hsgd::str_cat("model averaging level 0 (2:", world,
                                                "@outer=0.5/0.9,bf16,ef): the ", world,
                                                " ranks of group 'world' are on one node, so "
                                                "compression bf16 with error feedback does "
                                                "nothing there")),
                  std::string::npos)
            << log.text();
      }
    });
    EXPECT_RANKS_OK(result);
  }
}

// Rank 1 reaches the averaging of step 10 kLate after rank 0 (at step 0 the first call's
// tensor check would absorb it). With overlap 2, rank 0 merges at step 12 and waits there for
// rank 1's contribution: level_stats() count that wait in overlap_wait_seconds (within
// `seconds`), and state_dict() carries it. A level without overlap waits inside its averaging,
// which is not an overlap's wait: its overlap_wait_seconds stays 0.
TEST(LevelOptionsStats, OverlapWait_CountsTheMergeWaitingForALatePeer) {
  constexpr auto kLate = std::chrono::milliseconds(400);
  for (const int64_t overlap : {2, 0}) {
    auto result = run_world(2, [&](int rank, const auto& pg) {
      // An outer optimizer keeps the level off the plain path, so overlap 0 completes through
      // the same code as overlap 2, only at once.
      const LevelOptions level{
          .period = 10, .outer = OuterOptimizer{.lr = 1.0}, .overlap_steps = overlap};
      PeriodicModelAverager averager(level, 0, pg);
      Tensor p = make_param(initial_values(rank));
      for (int64_t t = 0; t < 13; ++t) {
        add_local_step(p, rank, t);
        if (rank == 1 && t == 10) std::this_thread::sleep_for(kLate);
        averager.average_parameters(std::vector<Tensor>{p});
      }
      const AveragingLevelStats stats = averager.level_stats()[0];
      const double late = std::chrono::duration<double>(kLate).count();
      if (overlap == 0) {
        EXPECT_EQ(stats.overlap_wait_seconds, 0.0) << "rank " << rank;
        if (rank == 0) {
          EXPECT_GE(stats.seconds, 0.5 * late);
        }
      } else if (rank == 0) {
        EXPECT_GE(stats.overlap_wait_seconds, 0.5 * late);
        EXPECT_LE(stats.overlap_wait_seconds, stats.seconds);
      }
      PeriodicModelAverager resumed(level, 0, pg);
      resumed.load_state_dict(averager.state_dict());
      EXPECT_EQ(resumed.level_stats()[0].overlap_wait_seconds, stats.overlap_wait_seconds);
    });
    EXPECT_RANKS_OK(result) << "overlap " << overlap;
  }
}

TEST(LevelOptions, PairConstructorsBuildPlainLevels) {
  auto result = run_world(2, [&](int, const auto& pg) {
    HierarchicalModelAverager hierarchical({{2, 1}, {4, 2}}, 0, pg);
    PeriodicModelAverager periodic(4, 0, pg);
    for (const LevelOptions& level : hierarchical.level_options()) EXPECT_TRUE(is_plain(level));
    EXPECT_TRUE(is_plain(periodic.level_options()[0]));
    EXPECT_EQ(periodic.level_options()[0].group_size, 2);
  });
  EXPECT_RANKS_OK(result);
}

TEST(Compression, RoundTripRoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(round_trip(Compression::kBF16, 1.0f + 1.0f / 256), 1.0f);               // tie: to even
  EXPECT_EQ(round_trip(Compression::kBF16, 1.0f + 3.0f / 256), 1.0f + 4.0f / 256);  // tie: up
  EXPECT_EQ(round_trip(Compression::kFP16, 1.0f + 1.0f / 2048), 1.0f);
  EXPECT_EQ(round_trip(Compression::kFP16, 1e6f), 65504.0f);  // saturates, no inf
  EXPECT_EQ(round_trip(Compression::kFP16, -1e6f), -65504.0f);
  EXPECT_TRUE(std::isnan(round_trip(Compression::kBF16, std::nanf(""))));
  // Packing: 5 values in two words, decoded back in order.
  const Values in = {1.0f, -2.0f, 0.5f, 3.0f, -0.25f};
  std::vector<int64_t> words(static_cast<size_t>(packed_words(Compression::kBF16, 5)));
  ASSERT_EQ(words.size(), 2u);
  Values residual(5, 0.0f);
  encode(Compression::kBF16, 1.0f, in, residual, words);
  Values sum(5, 1.0f);
  decode_add(Compression::kBF16, 1.0f, words, sum);
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(sum[i], 1.0f + in[i]) << i;
    EXPECT_EQ(residual[i], 0.0f) << i;
  }
  // Error feedback: the rounding error is kept and added to the next payload.
  const Values small = {1.0f + 1.0f / 512};
  Values e(1, 0.0f);
  std::vector<int64_t> w(1);
  encode(Compression::kBF16, 1.0f, small, e, w);
  EXPECT_EQ(e[0], 1.0f / 512);
}


// The step of a block is its largest magnitude over qmax; values are rounded to the nearest
// multiple of it (ties to even), so the largest value is exact.
TEST(Compression, BlockFormatsQuantizeEachBlockWithItsOwnStep) {
  for (const auto [compression, qmax] :
       {std::pair{Compression::kInt8, 127.0f}, std::pair{Compression::kInt4, 7.0f}}) {
    // Two blocks of very different magnitude, the second one short.
    Values in(static_cast<size_t>(kQuantBlock + 5));
    for (size_t i = 0; i < in.size(); ++i) {
      const float magnitude = i < static_cast<size_t>(kQuantBlock) ? 1.0f : 1e-3f;
      in[i] = magnitude * std::sin(0.37f * static_cast<float>(i) + 0.1f);
    }
    in[7] = -2.0f;  // the first block's largest magnitude
    const Values out = round_trip(compression, 1.0f, in);
    ASSERT_EQ(out.size(), in.size());
    for (size_t b = 0; b < 2; ++b) {
      const size_t begin = b * static_cast<size_t>(kQuantBlock);
      const size_t end = std::min(in.size(), begin + static_cast<size_t>(kQuantBlock));
      float largest = 0.0f;
      for (size_t i = begin; i < end; ++i) largest = std::max(largest, std::abs(in[i]));
      const float step = largest / qmax;
      for (size_t i = begin; i < end; ++i) {
        const float q = std::nearbyint(in[i] / step);
        EXPECT_LE(std::abs(q), qmax) << to_string(compression) << " value " << i;
        EXPECT_EQ(out[i], q * step) << to_string(compression) << " value " << i;
        EXPECT_LE(std::abs(out[i] - in[i]), 0.5f * step * (1 + 1e-6f)) << i;
      }
    }
    EXPECT_FLOAT_EQ(out[7], -2.0f) << to_string(compression);
    // Words: a step word per block, then 8 (int8) or 16 (int4) values a word.
    const int64_t per_word = compression == Compression::kInt8 ? 8 : 16;
    EXPECT_EQ(packed_words(compression, kQuantBlock + 5),
              (1 + kQuantBlock / per_word) + (1 + 1));
    EXPECT_EQ(packed_words(compression, 0), 0);
  }
}

TEST(Compression, BlockFormatsKeepZerosExactAndPoisonOnlyTheBlockWithANaN) {
  for (const Compression compression : {Compression::kInt8, Compression::kInt4}) {
    Values in(static_cast<size_t>(2 * kQuantBlock), 0.0f);
    Values out = round_trip(compression, 1.0f, in);
    for (const float v : out) EXPECT_EQ(v, 0.0f);
    in[3] = std::nanf("");
    in[static_cast<size_t>(kQuantBlock) + 1] = 0.75f;
    out = round_trip(compression, 1.0f, in);
    for (size_t i = 0; i < static_cast<size_t>(kQuantBlock); ++i) {
      EXPECT_TRUE(std::isnan(out[i])) << to_string(compression) << " value " << i;
    }
    EXPECT_FLOAT_EQ(out[static_cast<size_t>(kQuantBlock) + 1], 0.75f);
    EXPECT_EQ(out[static_cast<size_t>(kQuantBlock)], 0.0f);
  }
}

TEST(Compression, BlockFormatsCarryTheRoundingErrorInTheResidual) {
  for (const Compression compression : {Compression::kInt8, Compression::kInt4}) {
    Values payload(100), residual(100);
    for (size_t i = 0; i < payload.size(); ++i) {
      payload[i] = std::cos(0.21f * static_cast<float>(i));
      residual[i] = 0.01f * std::sin(static_cast<float>(i));
    }
    const Values before = residual;
    std::vector<int64_t> words(static_cast<size_t>(packed_words(compression, 100)));
    encode(compression, 1.0f, payload, residual, words);
    Values decoded(100, 0.0f);
    decode_add(compression, 1.0f, words, decoded);
    for (size_t i = 0; i < payload.size(); ++i) {
      const float v = payload[i] + before[i];
      EXPECT_EQ(residual[i], v - decoded[i]) << to_string(compression) << " value " << i;
    }
    // Summed over many averagings of the same payload, what arrives approaches the payload:
    // the error does not accumulate.
    Values e(100, 0.0f), total(100, 0.0f);
    const int rounds = 64;
    for (int r = 0; r < rounds; ++r) {
      encode(compression, 1.0f, payload, e, words);
      decode_add(compression, 1.0f, words, total);
    }
    for (size_t i = 0; i < payload.size(); ++i) {
      EXPECT_NEAR(total[i] / rounds, payload[i], 0.2f / rounds) << to_string(compression) << i;
    }
  }
}

TEST(Compression, BlockFormatsRefuseAScale) {
  LevelOptions level{.period = 4, .group_size = 2, .compression = Compression::kInt8,
                     .compression_scale = 64.0f};
  EXPECT_NE(validate_options(level, 1, "test").find("compression_scale 64 does not apply to int8"),
            std::string::npos)
      << validate_options(level, 1, "test");
  level.compression_scale = 1.0f;
  EXPECT_EQ(validate_options(level, 1, "test"), "");
  Values in(4, 1.0f);
  std::vector<int64_t> words(static_cast<size_t>(packed_words(Compression::kInt4, 4)));
  EXPECT_THROW(encode(Compression::kInt4, 2.0f, in, {}, words), InvalidArgument);
}

}  // namespace
}  // namespace hsgd::distributed
