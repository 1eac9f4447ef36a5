#include "models/resnet.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/data/data_loader.h"
#include "framework/data/synthetic_dataset.h"
#include "framework/nn/functional.h"
#include "framework/tensor/grad_mode.h"
#include "models/registry.h"
#include "optim/sgd.h"
#include "tests/golden/golden.h"

namespace hsgd::models {
namespace {

// tests/golden_resnet/data/<name>.txt through the shared golden-file reader (which is rooted at
// tests/golden/data).
golden::File resnet_golden(const std::string& name) {
  return golden::File("../../golden_resnet/data/" + name);
}

// "name d0 d1 ..." lines of tests/golden_resnet/data/state_dict_<model>.txt, as "name[d0, d1]".
std::vector<std::string> torch_state_dict_layout(const std::string& model) {
  const std::string path =
      std::string(HSGD_SOURCE_DIR) + "/tests/golden_resnet/data/state_dict_" + model + ".txt";
  std::ifstream in(path);
  HSGD_CHECK(in.good(), "missing '", path, "'; run tests/golden_resnet/generate.py");
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name;
    fields >> name;
    Shape shape;
    for (int64_t d = 0; fields >> d;) shape.push_back(d);
    out.push_back(name + shape_str(shape));
  }
  return out;
}

int64_t num_params(nn::Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += p.numel();
  return n;
}

class ResNetVariantTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ResNetVariantTest, ParameterCountsMatchPyTorch) {
  const std::string name = GetParam();
  auto model = make_model(name);
  const golden::File counts = resnet_golden("counts");
  EXPECT_EQ(num_params(*model), static_cast<int64_t>(counts.scalar(name + "_num_params")));
  EXPECT_EQ(static_cast<int64_t>(model->parameters().size()),
            static_cast<int64_t>(counts.scalar(name + "_num_param_tensors")));
  EXPECT_EQ(static_cast<int64_t>(model->state_dict().size()),
            static_cast<int64_t>(counts.scalar(name + "_num_state_entries")));
}

TEST_P(ResNetVariantTest, StateDictNamesAndShapesMatchPyTorch) {
  const std::string name = GetParam();
  auto model = make_model(name);
  std::vector<std::string> ours;
  for (const auto& [key, t] : model->state_dict()) ours.push_back(key + shape_str(t.shape()));
  const std::vector<std::string> torch = torch_state_dict_layout(name);
  ASSERT_EQ(ours.size(), torch.size());
  for (size_t i = 0; i < ours.size(); ++i) EXPECT_EQ(ours[i], torch[i]) << "entry " << i;
}

INSTANTIATE_TEST_SUITE_P(Variants, ResNetVariantTest,
                         ::testing::Values("resnet20", "resnet32", "resnet56", "resnet18"));

TEST(ResNetTest, OutputShapes_BatchesClassesAndImageSizes) {
  NoGradGuard no_grad;
  ResNet r20(resnet_cifar_options(20));
  EXPECT_EQ(shape_str(r20.forward(zeros({2, 3, 32, 32})).shape()), "[2, 10]");
  EXPECT_EQ(shape_str(r20.forward(zeros({1, 3, 32, 32})).shape()), "[1, 10]");
  ResNetOptions grey = resnet_cifar_options(20, /*num_classes=*/7);
  grey.in_channels = 1;
  EXPECT_EQ(shape_str(ResNet(grey).forward(zeros({3, 1, 28, 28})).shape()), "[3, 7]");
  ResNet r18(resnet18_options(100));
  EXPECT_EQ(shape_str(r18.forward(zeros({2, 3, 32, 32})).shape()), "[2, 100]");
}

// Weights, input and upstream values written by tests/golden_resnet/generate.py (train-mode
// BatchNorm, so batch statistics and the running-stat update are both covered).
TEST(ResNetTest, ProducesPyTorchValues_TinyForwardBackwardAndEval) {
  const golden::File f = resnet_golden("resnet_tiny");
  ResNet model({.blocks = {1, 1, 1}, .widths = {4, 8, 16}, .in_channels = 3, .num_classes = 5});
  nn::NamedTensors state;
  for (const std::string& key : f.keys()) {
    if (key.rfind("state.", 0) == 0) state.emplace_back(key.substr(6), f.tensor(key));
  }
  model.load_state_dict(state);  // strict: every name and shape must match torch's

  const Tensor x = f.tensor("x");
  Tensor logits = model.forward(x);
  Tensor loss = nn::cross_entropy(logits, f.targets("targets"));
  loss.backward();
  golden::expect_close(logits, f.tensor("logits"), "logits");
  golden::expect_close(loss, f.tensor("loss").reshape({}), "loss");
  for (const auto& [name, p] : model.named_parameters()) {
    golden::expect_close(p.grad(), f.tensor("grad." + name), "grad of " + name);
  }
  for (const auto& [name, b] : model.named_buffers()) {
    if (name.find("running") != std::string::npos) {
      golden::expect_close(b, f.tensor("after." + name), name + " after one forward");
    }
  }
  model.eval();
  NoGradGuard no_grad;
  golden::expect_close(model.forward(x), f.tensor("eval_logits"), "eval-mode logits");
}

// generate.py's hash_uniform(stream, i): splitmix64's finaliser of (stream, i), 24 bits, in [-1,
// 1).
double hash_uniform(uint64_t stream, uint64_t i) {
  uint64_t z = stream * 0x9E3779B97F4A7C15ull + (i + 1) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 40) / static_cast<double>(1 << 23) - 1.0;
}

// generate.py's formula_value(): element i of the k-th parameter.
float formula_value(const std::string& name, const Shape& shape, size_t k, int64_t i) {
  const double u = hash_uniform(k + 1, static_cast<uint64_t>(i));
  if (shape.size() >= 2) {
    return static_cast<float>(u / std::sqrt(static_cast<double>(shape_numel(shape) / shape[0])));
  }
  const bool gamma = name.ends_with("weight");  // 1-D weights are BatchNorm's gamma
  return static_cast<float>((gamma ? 1.0 : 0.0) + 0.1 * u);
}

// The real ResNet-20 at 32x32, end to end. Its 272K weights come from a formula both sides
// evaluate (an integer hash, exact in Python and C++), instead of a 4 MB file.
TEST(ResNetTest, ProducesPyTorchValues_ResNet20FormulaWeights) {
  const golden::File f = resnet_golden("resnet20_formula");
  ResNet model(resnet_cifar_options(20));
  const nn::NamedTensors params = model.named_parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    Tensor p = params[k].second;
    std::vector<float> values(static_cast<size_t>(p.numel()));
    for (int64_t i = 0; i < p.numel(); ++i) {
      values[static_cast<size_t>(i)] = formula_value(params[k].first, p.shape(), k, i);
    }
    p.copy_(from_vector(values, p.shape()));
  }
  golden::expect_close(nn::find_tensor(params, "conv1.weight"), f.tensor("param.conv1.weight"),
                       "formula weights of conv1");
  const Tensor x = f.tensor("x");  // (2,3,32,32)
  const std::vector<float> xv = x.to_vector();
  for (int64_t i = 0; i < x.numel(); i += 97) {
    ASSERT_EQ(xv[static_cast<size_t>(i)],
              static_cast<float>(2 * hash_uniform(0, static_cast<uint64_t>(i))))
        << "input index " << i;
  }

  Tensor logits = model.forward(x);
  Tensor loss = nn::cross_entropy(logits, f.targets("targets"));
  loss.backward();
  golden::expect_close(logits, f.tensor("logits"), "logits");
  golden::expect_close(loss, f.tensor("loss").reshape({}), "loss");
  int checked = 0;
  for (const std::string& key : f.keys()) {
    if (key.rfind("grad.", 0) != 0) continue;
    const Tensor p = nn::find_tensor(params, key.substr(5));
    ASSERT_TRUE(p.defined()) << "no parameter " << key.substr(5);
    golden::expect_close(p.grad(), f.tensor(key), key);
    ++checked;
  }
  EXPECT_GE(checked, 5);
  const nn::NamedTensors buffers = model.named_buffers();
  for (const char* name : {"bn1.running_mean", "layer3.2.bn2.running_var"}) {
    golden::expect_close(nn::find_tensor(buffers, name), f.tensor(std::string("after.") + name),
                         name);
  }
}

TEST(ResNetTest, SameSeedSameModel_DifferentSeedDifferentModel) {
  ResNet a(resnet_cifar_options(20, 10, 3)), b(resnet_cifar_options(20, 10, 3)),
      c(resnet_cifar_options(20, 10, 4));
  const auto pa = a.parameters(), pb = b.parameters(), pc = c.parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(pa[i].to_vector(), pb[i].to_vector()) << i;
  EXPECT_NE(pa[0].to_vector(), pc[0].to_vector());
}

// Default init is PyTorch's: conv weights in U(-1/sqrt(fan_in), 1/sqrt(fan_in)), BN 1 and 0.
TEST(ResNetTest, DefaultInit_MatchesPyTorchDistributions) {
  ResNet model(resnet_cifar_options(20));
  for (const auto& [name, p] : model.named_parameters()) {
    const std::vector<float> v = p.to_vector();
    if (p.dim() >= 2) {
      const double bound = 1.0 / std::sqrt(static_cast<double>(p.numel() / p.size(0)));
      double max_abs = 0;
      for (float x : v) max_abs = std::max(max_abs, static_cast<double>(std::fabs(x)));
      EXPECT_LE(max_abs, bound) << name;
      EXPECT_GT(max_abs, 0.5 * bound) << name;  // spread over the range, not all near zero
    } else if (name.find("bn") != std::string::npos ||
               name.find("downsample.1") != std::string::npos) {
      const float expected = name.ends_with("weight") ? 1.0f : 0.0f;
      for (float x : v) ASSERT_EQ(x, expected) << name;
    }
  }
}

// Convergence smoke test: a small ResNet on a learnable synthetic problem.
TEST(ResNetTest, TrainingLowersLoss_SyntheticImages) {
  auto data = std::make_shared<data::SyntheticDataset>(data::SyntheticOptions{
      .size = 256, .example_shape = {3, 12, 12}, .num_classes = 4, .noise = 1.0f, .seed = 5});
  ResNet model({.blocks = {1, 1, 1}, .widths = {8, 16, 32}, .num_classes = 4, .seed = 2});
  optim::SGD opt(model.parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
  data::DataLoader loader(data, {.batch_size = 32, .shuffle = true, .seed = 1});
  std::vector<float> losses;
  for (int64_t epoch = 0; losses.size() < 24; ++epoch) {
    loader.set_epoch(epoch);
    for (const data::Batch& batch : loader) {
      opt.zero_grad();
      Tensor loss = nn::cross_entropy(model.forward(batch.inputs), batch.targets);
      loss.backward();
      opt.step();
      losses.push_back(loss.item());
      if (losses.size() == 24) break;
    }
  }
  for (float l : losses) ASSERT_TRUE(std::isfinite(l));
  const double first = (losses[0] + losses[1] + losses[2]) / 3.0;
  const double last = (losses[21] + losses[22] + losses[23]) / 3.0;
  EXPECT_LT(last, 0.5 * first) << "first steps " << first << ", last steps " << last;
}

TEST(ResNetTest, BadOptionsAndInputs_AreRejectedWithTheValue) {
  EXPECT_THROW(resnet_cifar_options(21), InvalidArgument);
  EXPECT_THROW(resnet_cifar_options(2), InvalidArgument);
  EXPECT_THROW(ResNet({.blocks = {1, 1}, .widths = {4}}), InvalidArgument);
  EXPECT_THROW(ResNet({.blocks = {}, .widths = {}}), InvalidArgument);
  EXPECT_THROW(ResNet({.blocks = {1, 0}, .widths = {4, 8}}), InvalidArgument);
  EXPECT_THROW(ResNet({.num_classes = 0}), InvalidArgument);
  ResNet model({.blocks = {1}, .widths = {4}});
  try {
    model.forward(zeros({2, 1, 8, 8}));
    FAIL() << "a 1-channel input was accepted by a 3-channel ResNet";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 1, 8, 8]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model.forward(zeros({3, 8, 8})), InvalidArgument);
}

}  // namespace
}  // namespace hsgd::models
