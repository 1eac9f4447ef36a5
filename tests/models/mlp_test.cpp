#include "models/mlp.h"

#include <gtest/gtest.h>

#include <memory>

#include "comm/error.h"
#include "framework/data/data_loader.h"
#include "framework/data/synthetic_dataset.h"
#include "framework/nn/functional.h"
#include "framework/tensor/grad_mode.h"
#include "optim/sgd.h"

namespace hsgd::models {
namespace {

TEST(MLPTest, Layout_NamesShapesAndOutput) {
  MLP mlp({.sizes = {784, 512, 256, 10}});
  std::vector<std::string> names;
  for (auto& [name, p] : mlp.named_parameters()) names.push_back(name + shape_str(p.shape()));
  EXPECT_EQ(names, (std::vector<std::string>{"fc1.weight[512, 784]", "fc1.bias[512]",
                                             "fc2.weight[256, 512]", "fc2.bias[256]",
                                             "fc3.weight[10, 256]", "fc3.bias[10]"}));
  EXPECT_EQ(shape_str(mlp.forward(zeros({3, 1, 28, 28})).shape()), "[3, 10]");
  EXPECT_EQ(shape_str(mlp.forward(zeros({2, 784})).shape()), "[2, 10]");
}

TEST(MLPTest, SameSeedSameModel) {
  MLP a({.sizes = {6, 5, 3}, .seed = 4}), b({.sizes = {6, 5, 3}, .seed = 4}),
      c({.sizes = {6, 5, 3}, .seed = 5});
  EXPECT_EQ(a.parameters()[0].to_vector(), b.parameters()[0].to_vector());
  EXPECT_NE(a.parameters()[0].to_vector(), c.parameters()[0].to_vector());
  // The two layers draw different values from the shared stream.
  EXPECT_NE(a.parameters()[1].to_vector()[0], a.parameters()[3].to_vector()[0]);
}

TEST(MLPTest, BadSizes_AreRejected) {
  EXPECT_THROW(MLP({.sizes = {10}}), InvalidArgument);
  EXPECT_THROW(MLP({.sizes = {10, 0, 3}}), InvalidArgument);
  MLP mlp({.sizes = {8, 4}});
  try {
    mlp.forward(zeros({2, 7}));
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("7 features"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("in_features = 8"), std::string::npos) << e.what();
  }
}

// Convergence smoke test: SGD with momentum on a learnable synthetic problem must drive the loss
// well below its starting value and classify held-out data from the same distribution.
TEST(MLPTest, Converges_OnSyntheticData) {
  data::SyntheticOptions options{
      .size = 1024, .example_shape = {20}, .num_classes = 5, .noise = 1.0f, .seed = 3};
  auto train = std::make_shared<data::SyntheticDataset>(options);
  auto model = std::make_shared<MLP>(MLPOptions{.sizes = {20, 32, 5}, .seed = 1});
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  data::DataLoader loader(train, {.batch_size = 32, .shuffle = true, .seed = 2});
  auto full_loss = [&] {
    NoGradGuard no_grad;
    data::Batch all = loader.dataset().get_batch(loader.indices());
    return nn::cross_entropy(model->forward(all.inputs), all.targets).item();
  };
  const float initial = full_loss();
  for (int64_t epoch = 0; epoch < 5; ++epoch) {
    loader.set_epoch(epoch);
    for (const data::Batch& batch : loader) {
      opt.zero_grad();
      Tensor loss = nn::cross_entropy(model->forward(batch.inputs), batch.targets);
      loss.backward();
      opt.step();
    }
  }
  const float final_loss = full_loss();
  EXPECT_LT(final_loss, 0.25f * initial) << "initial " << initial << " final " << final_loss;
  // Held-out examples: same centroids (same seed), other size -> a different noise stream tail.
  options.size = 2048;
  data::SyntheticDataset held_out(options);
  std::vector<int64_t> tail;
  for (int64_t i = 1024; i < 2048; ++i) tail.push_back(i);
  NoGradGuard no_grad;
  data::Batch b = held_out.get_batch(tail);
  EXPECT_GT(nn::accuracy(model->forward(b.inputs), b.targets), 0.9);
}

}  // namespace
}  // namespace hsgd::models
