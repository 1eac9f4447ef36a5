// Trainer: one step = zero_grad, forward + loss, backward, optimizer step, then the post-step
// stages in the order added.

#include "framework/train/trainer.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/nn/nn.h"
#include "framework/tensor/ops.h"
#include "optim/sgd.h"

namespace hsgd {
namespace {

TEST(Trainer, Step_RunsOptimizerThenStagesInOrder) {
  Generator gen(3);
  auto model = std::make_shared<nn::Linear>(4, 3, true, gen);
  auto sgd = std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 0.5});
  Trainer trainer([&](const Tensor& x) { return model->forward(x); }, sgd);
  std::vector<std::string> calls;
  std::vector<float> weight_seen_by_stage;
  trainer.add_stage([&](StepContext& c) {
    calls.push_back("first@" + std::to_string(c.iteration));
    weight_seen_by_stage = model->parameters()[0].to_vector();
    EXPECT_EQ(&c.optimizer, sgd.get());
  });
  trainer.add_stage(
      [&](StepContext& c) { calls.push_back("second@" + std::to_string(c.iteration)); });

  const Tensor x = randn({5, 4}, gen);
  const std::vector<int64_t> y = {0, 1, 2, 1, 0};
  const std::vector<float> before = model->parameters()[0].to_vector();
  const float loss0 = trainer.step(x, y);
  // The stage ran after the optimizer step: it saw the updated weight.
  EXPECT_NE(weight_seen_by_stage, before);
  EXPECT_EQ(weight_seen_by_stage, model->parameters()[0].to_vector());
  float loss = loss0;
  for (int i = 0; i < 20; ++i) loss = trainer.step(x, y);
  EXPECT_LT(loss, loss0) << "training on one batch must lower its loss";
  ASSERT_EQ(calls.size(), 42u);
  EXPECT_EQ(calls[0], "first@0");
  EXPECT_EQ(calls[1], "second@0");
  EXPECT_EQ(calls[41], "second@20");
  EXPECT_EQ(trainer.iteration(), 21);
}

TEST(Trainer, StageErrorPropagatesAndStepIsNotCounted) {
  Generator gen(4);
  auto model = std::make_shared<nn::Linear>(2, 2, true, gen);
  auto sgd = std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 0.1});
  Trainer trainer([&](const Tensor& x) { return model->forward(x); }, sgd);
  trainer.add_stage([](StepContext&) { HSGD_THROW(Error, "stage failed"); });
  EXPECT_THROW(trainer.step(randn({3, 2}, gen), {0, 1, 0}), Error);
  EXPECT_EQ(trainer.iteration(), 0);
}

TEST(Trainer, InvalidArguments) {
  Generator gen(5);
  auto model = std::make_shared<nn::Linear>(2, 2, true, gen);
  auto sgd = std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 0.1});
  EXPECT_THROW(Trainer([](const Tensor& x) { return x; }, nullptr), InvalidArgument);
  Trainer trainer([&](const Tensor& x) { return model->forward(x); }, sgd);
  EXPECT_THROW(trainer.add_stage(std::shared_ptr<PostStepStage>()), InvalidArgument);
  EXPECT_THROW(trainer.add_stage(std::function<void(StepContext&)>()), InvalidArgument);
  // A non-scalar "loss".
  EXPECT_THROW(trainer.step([&] { return model->forward(randn({3, 2}, gen)); }), InvalidArgument);
}

}  // namespace
}  // namespace hsgd
