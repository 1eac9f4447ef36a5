// Ports of torch's test_post_localSGD_optimizer_parity (periodic and hierarchical averagers) and
// test_post_localSGD_optimizer_step_reload. Unlike torch's test, the gradient hook is
// post_localSGD_hook with small groups of contiguous ranks (pairs, threes, or each rank alone) as
// the intra-node group and rank-dependent inputs, so the replicas really drift apart and the
// averaging matters.

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/distributed/comm_hooks/post_local_sgd_hook.h"
#include "framework/distributed/ddp.h"
#include "framework/distributed/model_averaging/averagers.h"
#include "framework/distributed/model_averaging/hierarchical_model_averager.h"
#include "framework/nn/nn.h"
#include "framework/tensor/ops.h"
#include "optim/post_local_sgd_optimizer.h"
#include "optim/sgd.h"
#include "tests/support/world.h"

namespace hsgd::distributed {
namespace {

using hsgd::testing::run_world;

constexpr double kLearningRate = 0.03;

// torch's DDP_NET: fc1 Linear(2, 10, bias=False), fc2 Linear(10, 50), fc3 Linear(50, 4,
// bias=False), ReLU after fc1 and fc2. Same seed on every rank (DDP broadcasts anyway).
std::shared_ptr<nn::Module> make_ddp_net() {
  Generator gen(7);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(2, 10, false, gen));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(10, 50, true, gen));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(50, 4, false, gen));
  return net;
}

// A DDP replica whose gradients are averaged globally for `warmup` iterations, then within
// `intra`, a group of contiguous ranks (post-local SGD).
struct Replica {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<DistributedDataParallel> ddp;
};
Replica make_replica(const std::shared_ptr<comm::ProcessGroup>& pg,
                     const std::shared_ptr<comm::ProcessGroup>& intra, int64_t warmup) {
  Replica r{make_ddp_net(), nullptr};
  r.ddp = std::make_unique<DistributedDataParallel>(r.model, pg);
  r.ddp->register_comm_hook(
      std::make_shared<PostLocalSGDState>(
          PostLocalSGDState{.process_group = pg, .subgroup = intra, .start_localSGD_iter = warmup}),
      post_localSGD_hook);
  return r;
}

using MakeAverager =
    std::function<std::shared_ptr<ModelAverager>(const std::shared_ptr<comm::ProcessGroup>&)>;

struct ParityCase {
  const char* name;
  MakeAverager make;
  int64_t warmup;
  int world;
  int subgroup_size;          // the hook's intra-node group after warmup (contiguous ranks)
  int64_t global_averagings;  // of the 20 steps, those where the last level (the world) averages
};

class PostLocalSGDOptimizerTest : public ::testing::TestWithParam<ParityCase> {};

TEST_P(PostLocalSGDOptimizerTest, Parity_WrapperEqualsManualAveraging) {
  const ParityCase c = GetParam();
  const int world = c.world;
  auto result = run_world(world, [&](int rank, const auto& pg) {
    auto intra = comm::new_subgroups(pg, c.subgroup_size).first;
    Generator gen(100 + static_cast<uint64_t>(rank));  // each rank its own data
    const Tensor input = randn({world * 2, 2}, gen);
    const Tensor target = randn({world * 2, 4}, gen);

    // 1. Manual: SGD step, then the averager.
    Replica manual = make_replica(pg, intra, c.warmup);
    auto manual_averager = c.make(pg);
    optim::SGD manual_opt(manual.model->parameters(), {.lr = kLearningRate});
    // 2. The wrapper optimizer.
    Replica wrapped = make_replica(pg, intra, c.warmup);
    auto wrapped_averager = c.make(pg);
    optim::PostLocalSGDOptimizer wrapped_opt(
        std::make_shared<optim::SGD>(wrapped.model->parameters(),
                                     optim::SGDOptions{.lr = kLearningRate}),
        wrapped_averager);

    std::vector<float> initial = manual.model->parameters()[0].to_vector();
    for (int it = 0; it < 20; ++it) {
      manual_opt.zero_grad();
      mse_loss(manual.ddp->forward(input), target).backward();
      manual_opt.step();
      manual_averager->average_parameters(manual.model->parameters());

      wrapped_opt.zero_grad();
      mse_loss(wrapped.ddp->forward(input), target).backward();
      wrapped_opt.step();

      const auto p1 = manual.model->parameters(), p2 = wrapped.model->parameters();
      for (size_t i = 0; i < p1.size(); ++i) {
        EXPECT_EQ(p1[i].to_vector(), p2[i].to_vector()) << "wrapper, it " << it << " param " << i;
      }
    }
    EXPECT_NE(manual.model->parameters()[0].to_vector(), initial) << "the model did not train";
    EXPECT_EQ(manual_averager->step(), wrapped_averager->step());
    for (const auto* averager : {&manual_averager, &wrapped_averager}) {
      EXPECT_EQ((*averager)->level_stats().back().calls, c.global_averagings);
    }
  });
  EXPECT_RANKS_OK(result);
}

std::shared_ptr<ModelAverager> make_periodic(const std::shared_ptr<comm::ProcessGroup>& pg) {
  return std::make_shared<PeriodicModelAverager>(4, 10, pg);
}

// Groups of group_size contiguous ranks average every 2 steps, the world every 4.
MakeAverager make_hierarchical(int group_size) {
  return [group_size](const std::shared_ptr<comm::ProcessGroup>& pg) {
    return std::make_shared<HierarchicalModelAverager>(
        std::vector<std::pair<int64_t, int>>{{2, group_size}, {4, pg->size()}}, 4, pg);
  };
}

// Odd worlds: alone after warm-up (subgroup of one) in a world of 5, so the replicas drift and
// only the averager brings them together; odd groups of 3 in a world of 6.
INSTANTIATE_TEST_SUITE_P(
    Averagers, PostLocalSGDOptimizerTest,
    // Periodic (4, warm-up 10): steps 10, 14, 18. Hierarchical (warm-up 4): 4, 8, 12, 16.
    ::testing::Values(ParityCase{"Periodic", make_periodic, 10, 4, 2, 3},
                      ParityCase{"Hierarchical", make_hierarchical(2), 4, 4, 2, 4},
                      ParityCase{"PeriodicWorld5", make_periodic, 10, 5, 1, 3},
                      ParityCase{"HierarchicalWorld6GroupsOf3", make_hierarchical(3), 4, 6, 3, 4}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(PostLocalSGDOptimizer, StepReload_RestoresAveragerStepOrResetsToZero) {
  const int world = 4;
  auto result = run_world(world, [&](int, const auto& pg) {
    auto model = make_ddp_net();
    DistributedDataParallel ddp(model, pg);
    auto averager = std::make_shared<PeriodicModelAverager>(4, 10, pg);
    optim::PostLocalSGDOptimizer opt(
        std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = kLearningRate}),
        averager);
    auto averager2 = std::make_shared<PeriodicModelAverager>(4, 10, pg);
    optim::PostLocalSGDOptimizer dummy(
        std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = kLearningRate}),
        averager2);

    Generator gen(5);
    const Tensor input = randn({world * 2, 2}, gen), target = randn({world * 2, 4}, gen);
    for (int it = 0; it < 20; ++it) {
      opt.zero_grad();
      mse_loss(ddp.forward(input), target).backward();
      opt.step();
    }
    const StateDict saved = opt.state_dict();
    ASSERT_TRUE(saved.contains("step"));
    dummy.load_state_dict(saved);
    EXPECT_EQ(averager->step(), 20) << "one averager step per optimizer step";
    EXPECT_EQ(averager2->step(), 20);

    StateDict without_step;
    for (const auto& [key, value] : saved.entries()) {
      if (key != "step") without_step.set(key, value);
    }
    ASSERT_FALSE(without_step.contains("step"));
    dummy.load_state_dict(without_step);  // warns and resets
    EXPECT_EQ(averager2->step(), 0);
  });
  EXPECT_RANKS_OK(result);
}

TEST(PostLocalSGDOptimizer, NullArguments_Throw) {
  auto sgd =
      std::make_shared<optim::SGD>(make_ddp_net()->parameters(), optim::SGDOptions{.lr = 0.1});
  EXPECT_THROW(optim::PostLocalSGDOptimizer(nullptr, nullptr), InvalidArgument);
  EXPECT_THROW(optim::PostLocalSGDOptimizer(sgd, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace hsgd::distributed
