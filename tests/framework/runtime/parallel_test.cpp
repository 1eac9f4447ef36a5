// runtime::make_parallel with emulated nodes (ParallelOptions::emulated_node_size): 4 ranks of
// ONE node behave as 2 nodes of 2 -- replicas differ between the averagings of the top level and
// agree after each; without the option they stay identical and a warning names the option; bad
// sizes are refused naming the value.

#include "framework/runtime/parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "framework/nn/functional.h"
#include "models/mlp.h"
#include "optim/sgd.h"
#include "tests/support/log_capture.h"
#include "tests/support/multiprocess.h"
#include "tests/support/world.h"

namespace hsgd::runtime {
namespace {

constexpr int kWorld = 4;
constexpr int64_t kSteps = 8;

// For each rank, the smallest rank whose parameters equal its own bitwise: {0, 0, 2, 2} is two
// pairs of identical replicas, {0, 0, 0, 0} one replica everywhere.
using Classes = std::vector<int>;

Classes replica_classes(comm::ProcessGroup& world, nn::Module& model) {
  std::vector<float> mine;
  for (const Tensor& p : model.parameters()) {
    const std::vector<float> v = p.to_vector();
    mine.insert(mine.end(), v.begin(), v.end());
  }
  std::vector<float> all(mine.size() * static_cast<size_t>(world.size()));
  world.allgather(std::span<const float>(mine), std::span<float>(all), "replicas")->wait();
  Classes classes(static_cast<size_t>(world.size()));
  for (int r = 0; r < world.size(); ++r) {
    for (int q = 0; q <= r; ++q) {
      if (std::equal(all.begin() + q * mine.size(), all.begin() + (q + 1) * mine.size(),
                     all.begin() + r * mine.size())) {
        classes[static_cast<size_t>(r)] = q;
        break;
      }
    }
  }
  return classes;
}

// Trains kSteps steps on rank-specific batches through make_parallel(options) (the averager after
// each optimizer step, as the Runtime does) and returns the replica classes after each step.
std::vector<Classes> train(int rank, const std::shared_ptr<comm::ProcessGroup>& world,
                           const ParallelOptions& options) {
  auto model = std::make_shared<models::MLP>(models::MLPOptions{.sizes = {8, 6, 3}, .seed = 7});
  Parallel parallel = make_parallel(model, world, options);
  optim::SGD sgd(model->parameters(), {.lr = 0.1});
  std::vector<Classes> out;
  for (int64_t step = 0; step < kSteps; ++step) {
    Generator gen(static_cast<uint64_t>(1000 * rank + step));
    const Tensor x = randn({4, 8}, gen);
    const std::vector<int64_t> targets = {rank % 3, (rank + 1) % 3, step % 3, 0};
    sgd.zero_grad();
    nn::cross_entropy(parallel.forward(*model, x), targets).backward();
    sgd.step();
    parallel.averager->average_parameters(model->parameters());
    out.push_back(replica_classes(*world, *model));
  }
  return out;
}

// What each step should give: the top level (period 4) after steps 0, 4; the node level (period 2)
// after steps 2, 6; `between` otherwise.
std::vector<Classes> expected(const Classes& between) {
  std::vector<Classes> out;
  for (int64_t step = 0; step < kSteps; ++step) {
    if (step % 4 == 0) {
      out.push_back({0, 0, 0, 0});
    } else if (step % 2 == 0) {
      out.push_back({0, 0, 2, 2});
    } else {
      out.push_back(between);
    }
  }
  return out;
}

ParallelOptions hierarchy(int emulated_node_size, int subgroup_size = 0) {
  return {.mode = Mode::kHierarchical,
          .levels = distributed::parse_hierarchy("2:node,4:world"),
          .subgroup_size = subgroup_size,
          .emulated_node_size = emulated_node_size};
}

// One node of 4 ranks (LOCAL_WORLD_SIZE 4), emulated as 2 nodes of 2: the gradients are averaged
// within each emulated node, so pairs {0, 1} and {2, 3} stay identical, the pairs differ between
// top-level averagings and agree after each.
TEST(ParallelTest, EmulatedNodes_PairsDriftApartAndMeetAtTheTopLevel) {
  auto result =
      testing::run_world(kWorld, {.local_world_size = 4}, [](int rank, const auto& world) {
        const std::vector<Classes> got = train(rank, world, hierarchy(2));
        const std::vector<Classes> want = expected({0, 0, 2, 2});
        for (size_t s = 0; s < want.size(); ++s) {
          EXPECT_EQ(got[s], want[s]) << "after step " << s;
        }
      });
  EXPECT_RANKS_OK(result);
}

// With no gradient averaging after warm-up (subgroup_size 1), every replica differs between
// averagings; the emulated node level makes pairs agree, the top level all four.
TEST(ParallelTest, EmulatedNodes_NoGradientAveraging_EachLevelJoinsItsGroups) {
  auto result =
      testing::run_world(kWorld, {.local_world_size = 4}, [](int rank, const auto& world) {
        const std::vector<Classes> got = train(rank, world, hierarchy(2, /*subgroup_size=*/1));
        const std::vector<Classes> want = expected({0, 1, 2, 3});
        for (size_t s = 0; s < want.size(); ++s) {
          EXPECT_EQ(got[s], want[s]) << "after step " << s;
        }
      });
  EXPECT_RANKS_OK(result);
}

// Control: the same job without the option. The post-local gradient group and the 'node' level
// are the whole world, so the replicas never differ; rank 0 warns, naming the option.
TEST(ParallelTest, OneNodeWithoutEmulation_ReplicasStayIdenticalAndTheWarningNamesTheOption) {
  auto result =
      testing::run_world(kWorld, {.local_world_size = 4}, [](int rank, const auto& world) {
        testing::LogCapture log;
        const std::vector<Classes> got = train(rank, world, hierarchy(0));
        for (size_t s = 0; s < got.size(); ++s) {
          EXPECT_EQ(got[s], (Classes{0, 0, 0, 0})) << "after step " << s;
        }
        if (rank != 0) return;
        const std::string text = log.text();
        EXPECT_NE(text.find("the replicas stay identical"), std::string::npos) << text;
        EXPECT_NE(text.find("levels {4:world} do not fit"), std::string::npos) << text;
        EXPECT_NE(text.find("'node' is the whole group here"), std::string::npos) << text;
        size_t named = 0;
        for (size_t at = text.find("emulated_node_size"); at != std::string::npos;
             at = text.find("emulated_node_size", at + 1)) {
          ++named;
        }
        EXPECT_EQ(named, 2u) << "both warnings should name the option:\n" << text;
      });
  EXPECT_RANKS_OK(result);
}

TEST(ParallelTest, EmulatedNodeSizeNotDividingTheWorld_IsAMismatchNamingIt) {
  auto result = testing::run_world(kWorld, {.local_world_size = 4}, [](int, const auto& world) {
    auto model = std::make_shared<models::MLP>(models::MLPOptions{.sizes = {8, 3}});
    try {
      make_parallel(model, world, hierarchy(3));
      ADD_FAILURE() << "emulated_node_size 3 on 4 ranks was accepted";
    } catch (const ParallelMismatch& e) {
      EXPECT_EQ(e.option(), "emulated_node_size");
      EXPECT_EQ(e.world_size(), kWorld);
      EXPECT_NE(std::string(e.what()).find("emulated_node_size 3 must divide the world size 4"),
                std::string::npos)
          << e.what();
    }
  });
  EXPECT_RANKS_OK(result);
}

TEST(ParallelTest, Check_RefusesANegativeEmulatedNodeSizeAndOneWithDDP) {
  ParallelOptions negative = hierarchy(-1);
  EXPECT_NE(check(negative).find("emulated_node_size -1 must be at least 1"), std::string::npos)
      << check(negative);
  const ParallelOptions ddp{.mode = Mode::kDDP, .emulated_node_size = 2};
  EXPECT_NE(check(ddp).find("emulated_node_size 2 would change nothing"), std::string::npos)
      << check(ddp);
  EXPECT_EQ(check(hierarchy(2)), "");
}

}  // namespace
}  // namespace hsgd::runtime
