#include "optim/lr_scheduler.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include "comm/error.h"
#include "optim/sgd.h"
#include "tests/golden/golden.h"

namespace hsgd::optim {
namespace {

// Two groups with base lrs 0.1 and 0.02, as generate.py's sched_case.
struct Fixture {
  Tensor a = ones({1}), b = ones({1});
  std::unique_ptr<SGD> opt;
  Fixture() {
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    opt = std::make_unique<SGD>(
        std::vector<ParamGroup>{{.params = {a}, .lr = 0.1}, {.params = {b}, .lr = 0.02}},
        SGDOptions{.lr = 0.1});
  }
};

void check(const std::string& key,
           const std::function<std::unique_ptr<LRScheduler>(Optimizer&)>& make) {
  golden::File f("lr_schedulers");
  const golden::Entry& e = f.entry(key);  // (epochs + 1, 2)
  Fixture fx;
  std::unique_ptr<LRScheduler> sched = make(*fx.opt);
  for (int64_t epoch = 0; epoch < e.shape[0]; ++epoch) {
    for (size_t g = 0; g < 2; ++g) {
      const double expected = e.values[static_cast<size_t>(epoch) * 2 + g];
      const double actual = *fx.opt->param_groups()[g].lr;
      EXPECT_NEAR(actual, expected, 1e-6 * std::abs(expected) + 1e-9)
          << key << " epoch " << epoch << " group " << g;
      EXPECT_EQ(sched->get_last_lr()[g], actual);
    }
    fx.opt->step();
    sched->step();
  }
}

TEST(LRSchedulerTest, ProducesPyTorchValues_StepLR) {
  check("step_lr", [](Optimizer& o) {
    return std::make_unique<StepLR>(o, StepLROptions{.step_size = 3, .gamma = 0.5});
  });
}

TEST(LRSchedulerTest, ProducesPyTorchValues_MultiStepLR) {
  check("multi_step_lr", [](Optimizer& o) {
    return std::make_unique<MultiStepLR>(o,
                                         MultiStepLROptions{.milestones = {2, 5, 9}, .gamma = 0.1});
  });
}

TEST(LRSchedulerTest, ProducesPyTorchValues_CosineAnnealingLRPastTMax) {
  check("cosine_annealing_lr", [](Optimizer& o) {
    return std::make_unique<CosineAnnealingLR>(
        o, CosineAnnealingLROptions{.t_max = 10, .eta_min = 0.001});
  });
}

TEST(LRSchedulerTest, ProducesPyTorchValues_LinearWarmup) {
  check("linear_warmup", [](Optimizer& o) {
    return std::make_unique<LinearWarmup>(
        o, LinearWarmupOptions{.start_factor = 0.25, .total_iters = 4});
  });
}

// Warm-up then cosine, and three phases, as torch's SequentialLR (each phase counts from 0 when
// it starts; all use the lrs from before the first scheduler, not what a later one captured).
TEST(LRSchedulerTest, ProducesPyTorchValues_SequentialLR) {
  std::vector<std::unique_ptr<LRScheduler>> parts;
  check("sequential_warmup_cosine", [&](Optimizer& o) {
    parts.push_back(std::make_unique<LinearWarmup>(
        o, LinearWarmupOptions{.start_factor = 0.25, .total_iters = 4}));
    parts.push_back(std::make_unique<CosineAnnealingLR>(
        o, CosineAnnealingLROptions{.t_max = 10, .eta_min = 0.001}));
    return std::make_unique<SequentialLR>(
        o, std::vector<const LRScheduler*>{parts[0].get(), parts[1].get()},
        std::vector<int64_t>{4});
  });
  parts.clear();
  check("sequential_three", [&](Optimizer& o) {
    parts.push_back(std::make_unique<LinearWarmup>(
        o, LinearWarmupOptions{.start_factor = 0.5, .total_iters = 2}));
    parts.push_back(std::make_unique<StepLR>(o, StepLROptions{.step_size = 3, .gamma = 0.5}));
    parts.push_back(
        std::make_unique<MultiStepLR>(o, MultiStepLROptions{.milestones = {1, 3}, .gamma = 0.1}));
    return std::make_unique<SequentialLR>(
        o, std::vector<const LRScheduler*>{parts[0].get(), parts[1].get(), parts[2].get()},
        std::vector<int64_t>{2, 8});
  });
}

TEST(LRSchedulerTest, SequentialLR_BadArgumentsNameTheValue) {
  Fixture fx, other;
  StepLR a(*fx.opt, {.step_size = 2});
  StepLR b(*fx.opt, {.step_size = 3});
  StepLR foreign(*other.opt, {.step_size = 3});
  auto message = [&](std::vector<const LRScheduler*> s, std::vector<int64_t> m) {
    try {
      SequentialLR seq(*fx.opt, std::move(s), std::move(m));
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({&a, &b}, {}).find("2 schedulers need 1 milestones, got 0"), std::string::npos);
  EXPECT_NE(
      message({&a, &b, &a}, {5, 5}).find("milestone 1 (5) must be greater than milestone 0 (5)"),
      std::string::npos);
  EXPECT_NE(message({&a, &b}, {0}).find("milestone 0 (0) must be greater than 0"),
            std::string::npos);
  EXPECT_NE(message({&a, &foreign}, {3}).find("scheduler 1 drives another optimizer"),
            std::string::npos);
  EXPECT_NE(message({}, {}).find("at least one scheduler"), std::string::npos);
}

TEST(LRSchedulerTest, SetLastEpoch_JumpsToTheClosedForm) {
  Fixture fx;
  StepLR sched(*fx.opt, {.step_size = 2, .gamma = 0.1});
  sched.set_last_epoch(5);
  EXPECT_NEAR(*fx.opt->param_groups()[0].lr, 0.1 * 0.01, 1e-12);
  EXPECT_EQ(sched.last_epoch(), 5);
}

TEST(LRSchedulerTest, InvalidOptions_AreRejectedWithTheValue) {
  Fixture fx;
  EXPECT_THROW(StepLR(*fx.opt, {.step_size = 0}), InvalidArgument);
  EXPECT_THROW(CosineAnnealingLR(*fx.opt, {.t_max = -3}), InvalidArgument);
  EXPECT_THROW(LinearWarmup(*fx.opt, {.start_factor = 0}), InvalidArgument);
  EXPECT_THROW(MultiStepLR(*fx.opt, {.milestones = {-1}}), InvalidArgument);
  try {
    LinearWarmup(*fx.opt, {.total_iters = 0});
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("total_iters 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hsgd::optim
