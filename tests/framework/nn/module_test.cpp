#include "framework/nn/module.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "comm/error.h"
#include "framework/nn/nn.h"
#include "framework/tensor/ops.h"
#include "tests/golden/golden.h"

namespace hsgd::nn {
namespace {

// Runs fn, expects InvalidArgument whose message contains every fragment.
template <typename Fn>
void expect_invalid(Fn fn, const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected hsgd::InvalidArgument";
  } catch (const InvalidArgument& e) {
    for (const auto& f : fragments) {
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "message '" << e.what() << "' lacks '" << f << "'";
    }
  }
}

std::vector<std::string> names(const NamedTensors& named) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

// Same layers as generate.py's convnet(): Conv-BN-ReLU-MaxPool-Flatten-Linear.
std::shared_ptr<Sequential> make_convnet() {
  auto net = std::make_shared<Sequential>();
  net->push_back(std::make_shared<Conv2d>(Conv2dOptions{
      .in_channels = 2, .out_channels = 4, .kernel_size = {3, 3}, .padding = {1, 1}}));
  net->push_back(std::make_shared<BatchNorm2d>(4));
  net->push_back(std::make_shared<ReLU>());
  net->push_back(std::make_shared<MaxPool2d>(Size2{2, 2}));
  net->push_back(std::make_shared<Flatten>());
  net->push_back(std::make_shared<Linear>(36, 3));
  return net;
}

TEST(ModuleTest, StateDictKeysAndOrder_MatchPyTorch) {
  // torch's state_dict keys of the same network, in torch's order, from the golden file.
  golden::File f("sgd_convnet");
  std::vector<std::string> expected;
  for (const std::string& key : f.keys()) {
    if (key.rfind("init.", 0) == 0) expected.push_back(key.substr(5));
  }
  auto net = make_convnet();
  EXPECT_EQ(names(net->state_dict()), expected);
  for (const auto& [name, t] : net->state_dict()) {
    EXPECT_EQ(shape_str(t.shape()), shape_str(f.entry("init." + name).shape)) << name;
  }
}

TEST(ModuleTest, NamedParameters_DottedNamesInRegistrationOrder) {
  auto net = make_convnet();
  EXPECT_EQ(
      names(net->named_parameters()),
      (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "5.weight", "5.bias"}));
  EXPECT_EQ(names(net->named_buffers()),
            (std::vector<std::string>{"1.running_mean", "1.running_var", "1.num_batches_tracked"}));
  EXPECT_EQ(net->parameters().size(), 6u);
  EXPECT_TRUE(net->named_parameters(/*recurse=*/false).empty());
  for (const Tensor& p : net->parameters()) EXPECT_TRUE(p.requires_grad());
  for (const Tensor& b : net->buffers()) EXPECT_FALSE(b.requires_grad());
  // Handles, not copies: writing through parameters() changes the module.
  net->parameters()[1].fill_(3.0f);
  EXPECT_EQ(find_tensor(net->state_dict(), "0.bias").to_vector()[0], 3.0f);
}

TEST(ModuleTest, NamedModules_IncludeSelfAndNestedNames) {
  auto outer = std::make_shared<Sequential>();
  outer->push_back(make_convnet());
  outer->push_back(std::make_shared<ReLU>());
  std::vector<std::string> got;
  for (auto& [name, m] : outer->named_modules()) got.push_back(name + ":" + m->type_name());
  EXPECT_EQ(got.front(), ":Sequential");
  EXPECT_EQ(got[1], "0:Sequential");
  EXPECT_EQ(got[3], "0.1:BatchNorm2d");
  EXPECT_EQ(got.back(), "1:ReLU");
  EXPECT_EQ(names(outer->named_parameters())[0], "0.0.weight");
}

// named_children() and children() are the direct submodules only, in registration order (as
// torch's named_children()), not the nested ones named_modules() walks.
TEST(ModuleTest, NamedChildren_DirectSubmodulesInRegistrationOrder) {
  auto outer = std::make_shared<Sequential>();
  outer->push_back(make_convnet());
  outer->push_back(std::make_shared<ReLU>());
  std::vector<std::string> got;
  for (const auto& [name, m] : outer->named_children()) got.push_back(name + ":" + m->type_name());
  EXPECT_EQ(got, (std::vector<std::string>{"0:Sequential", "1:ReLU"}));
  ASSERT_EQ(outer->children().size(), 2u);
  EXPECT_EQ(outer->children()[0], outer->named_children()[0].second);
  EXPECT_EQ(outer->children()[0]->named_children().size(), 6u);
  EXPECT_TRUE(outer->children()[1]->named_children().empty());
}

TEST(ModuleTest, Register_RejectsDuplicateAndDottedNames) {
  Module m("Custom");
  m.register_parameter("w", zeros({2}));
  expect_invalid([&] { m.register_parameter("w", zeros({2})); }, {"Custom", "'w'", "already"});
  expect_invalid([&] { m.register_buffer("w", zeros({2})); }, {"'w'", "already"});
  expect_invalid([&] { m.register_parameter("a.b", zeros({2})); }, {"'a.b'", "'.'"});
  expect_invalid([&] { m.register_parameter("", zeros({2})); }, {"empty"});
  expect_invalid([&] { m.register_parameter("u", Tensor()); }, {"'u'", "undefined"});
}

// Generators share the names of parameters, buffers and submodules, are listed by dotted name
// depth-first, and stay out of state_dict().
TEST(ModuleTest, RegisterGenerator_CheckedNamesDottedListNotInStateDict) {
  Generator gen(1);
  Module m("Custom");
  m.register_parameter("w", zeros({2}));
  expect_invalid([&] { m.register_generator("w", gen); }, {"generator", "'w'", "already"});
  expect_invalid([&] { m.register_generator("a.b", gen); }, {"'a.b'", "'.'"});
  EXPECT_EQ(&m.register_generator("rng", gen), &gen);
  expect_invalid([&] { m.register_buffer("rng", zeros({2})); }, {"'rng'", "already"});

  auto outer = std::make_shared<Sequential>();
  outer->push_back(std::make_shared<Linear>(3, 3));
  outer->push_back(std::make_shared<Dropout>(0.5, 1));
  auto inner = std::make_shared<Sequential>();
  inner->push_back(std::make_shared<Dropout>(0.2, 2));
  outer->push_back(inner);
  std::vector<std::string> got;
  for (const auto& [name, g] : outer->named_generators()) got.push_back(name);
  EXPECT_EQ(got, (std::vector<std::string>{"1.generator", "2.0.generator"}));
  EXPECT_EQ(names(outer->state_dict()), (std::vector<std::string>{"0.weight", "0.bias"}));
}

TEST(ModuleTest, TrainEval_PropagatesToChildren) {
  auto net = make_convnet();
  EXPECT_TRUE((*net)[1]->is_training());
  net->eval();
  for (auto& [name, m] : net->named_modules()) EXPECT_FALSE(m->is_training()) << name;
  net->train();
  for (auto& [name, m] : net->named_modules()) EXPECT_TRUE(m->is_training()) << name;
}

TEST(ModuleTest, ZeroGrad_ZeroesDefinedGradientsAndKeepsUndefined) {
  Linear fc(3, 2);
  Tensor x = ones({4, 3});
  sum(fc.forward(x)).backward();
  ASSERT_TRUE(fc.weight().grad().defined());
  fc.zero_grad();
  for (float v : fc.weight().grad().to_vector()) EXPECT_EQ(v, 0.0f);
  for (float v : fc.bias().grad().to_vector()) EXPECT_EQ(v, 0.0f);
  Linear fresh(3, 2);
  fresh.zero_grad();
  EXPECT_FALSE(fresh.weight().grad().defined());
}

TEST(ModuleTest, LoadStateDict_RoundTripsValues) {
  auto a = make_convnet();
  Generator gen(5);
  auto b = make_convnet();
  for (Tensor& p : b->parameters()) p.copy_(randn(p.shape(), gen));
  a->load_state_dict(b->state_dict());
  const NamedTensors sa = a->state_dict(), sb = b->state_dict();
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].second.to_vector(), sb[i].second.to_vector()) << sa[i].first;
    EXPECT_FALSE(sa[i].second.shares_storage_with(sb[i].second)) << sa[i].first;
  }
}

TEST(ModuleTest, LoadStateDict_MissingKeyIsNamedAndNothingChanges) {
  auto net = make_convnet();
  NamedTensors state;
  for (auto& [name, t] : net->state_dict()) {
    if (name != "1.running_var") state.emplace_back(name, full(t.shape(), 7.0f));
  }
  const std::vector<float> before = (*net)[0]->named_parameters()[0].second.to_vector();
  expect_invalid([&] { net->load_state_dict(state); }, {"missing key '1.running_var'"});
  EXPECT_EQ((*net)[0]->named_parameters()[0].second.to_vector(), before);
  net->load_state_dict(state, /*strict=*/false);  // non-strict tolerates the missing key
  EXPECT_EQ((*net)[0]->named_parameters()[0].second.to_vector()[0], 7.0f);
}

TEST(ModuleTest, LoadStateDict_WrongShapeAndUnexpectedKeyAreNamed) {
  Linear fc(3, 2);
  expect_invalid(
      [&] {
        fc.load_state_dict({{"weight", zeros({3, 2})}, {"bias", zeros({2})}});
      },
      {"'weight'", "[3, 2]", "expected [2, 3]"});
  expect_invalid(
      [&] {
        fc.load_state_dict(
            {{"weight", zeros({2, 3})}, {"bias", zeros({2})}, {"extra", zeros({1})}});
      },
      {"unexpected key 'extra'"});
}

TEST(ModuleTest, Linear_WrongInputFeaturesNamesBothSizes) {
  Linear fc(784, 10);
  expect_invalid([&] { fc.forward(zeros({2, 783})); }, {"783", "784", "[2, 783]"});
}

TEST(ModuleTest, Conv2dAndBatchNorm_WrongChannelsAreNamed) {
  Conv2d conv({.in_channels = 3, .out_channels = 4, .kernel_size = {3, 3}});
  expect_invalid([&] { conv.forward(zeros({1, 2, 5, 5})); }, {"2 channels", "in_channels = 3"});
  BatchNorm2d bn(4);
  expect_invalid([&] { bn.forward(zeros({2, 3, 2, 2})); }, {"3 channels", "num_features = 4"});
  expect_invalid([] { Dropout(1.5); }, {"1.5", "[0, 1)"});
}

// The default initialisation must be PyTorch's distribution: U(-b, b) with b = 1/sqrt(fan_in).
void expect_uniform(const Tensor& t, double bound, const std::string& what) {
  const std::vector<float> v = t.to_vector();
  double mean = 0, sq = 0, lo = 1e9, hi = -1e9;
  for (float x : v) {
    mean += x;
    sq += static_cast<double>(x) * x;
    lo = std::min<double>(lo, x);
    hi = std::max<double>(hi, x);
  }
  const double n = static_cast<double>(v.size());
  mean /= n;
  const double var = sq / n - mean * mean;
  EXPECT_GE(lo, -bound) << what;
  EXPECT_LE(hi, bound) << what;
  // Uniform(-b, b): variance b^2/3; with >= 1000 samples these hold with huge margin.
  EXPECT_NEAR(var, bound * bound / 3, 0.1 * bound * bound / 3) << what;
  EXPECT_NEAR(mean, 0.0, 0.1 * bound) << what;
}

TEST(ModuleTest, DefaultInit_MatchesPyTorchDistribution) {
  Linear fc(400, 30);
  expect_uniform(fc.weight(), 1 / std::sqrt(400.0), "Linear weight");
  Conv2d conv({.in_channels = 8, .out_channels = 64, .kernel_size = {3, 3}});
  expect_uniform(conv.weight(), 1 / std::sqrt(72.0), "Conv2d weight");
  Linear wide(10, 2000);
  expect_uniform(wide.bias(), 1 / std::sqrt(10.0), "Linear bias");
  BatchNorm2d bn(3);
  EXPECT_EQ(bn.weight().to_vector(), std::vector<float>(3, 1.0f));
  EXPECT_EQ(bn.bias().to_vector(), std::vector<float>(3, 0.0f));
  EXPECT_EQ(bn.running_var().to_vector(), std::vector<float>(3, 1.0f));
}

TEST(ModuleTest, Init_IsDeterministicPerGeneratorSeed) {
  Generator g1(11), g2(11), g3(12);
  Linear a(5, 4, true, g1), b(5, 4, true, g2), c(5, 4, true, g3);
  EXPECT_EQ(a.weight().to_vector(), b.weight().to_vector());
  EXPECT_NE(a.weight().to_vector(), c.weight().to_vector());
}

TEST(ModuleTest, Dropout_TrainingDropsAndEvalIsIdentity) {
  Dropout drop(0.5, /*seed=*/3);
  const Tensor x = ones({1000});
  const std::vector<float> y = drop.forward(x).to_vector();
  int zeros_seen = 0;
  for (float v : y) {
    EXPECT_TRUE(v == 0.0f || v == 2.0f) << v;
    zeros_seen += v == 0.0f;
  }
  EXPECT_GT(zeros_seen, 400);
  EXPECT_LT(zeros_seen, 600);
  drop.eval();
  EXPECT_EQ(drop.forward(x).to_vector(), x.to_vector());
}

TEST(ModuleTest, Sequential_ForwardChainsModulesInOrder) {
  auto net = std::make_shared<Sequential>();
  auto fc = net->push_back(std::make_shared<Linear>(3, 2));
  net->push_back(std::make_shared<ReLU>());
  Tensor x = from_vector({1, -2, 3, -1, 0, 2}, {2, 3});
  EXPECT_EQ(net->forward(x).to_vector(), relu(fc->forward(x)).to_vector());
  EXPECT_EQ(net->size(), 2u);
  expect_invalid([&] { (*net)[2]; }, {"index"});
}

}  // namespace
}  // namespace hsgd::nn

namespace hsgd::nn {
namespace {

// Layers built without a Generator draw from the default generator: two of one shape differ,
// and manual_seed makes a build repeatable (as torch.manual_seed does).
TEST(DefaultGeneratorTest, LayersOfOneShapeDifferAndManualSeedRepeats) {
  manual_seed(3);
  Linear a(64, 64), b(64, 64);
  Conv2d c({.in_channels = 3, .out_channels = 8, .kernel_size = {3, 3}});
  EXPECT_NE(a.named_parameters()[0].second.to_vector(), b.named_parameters()[0].second.to_vector());
  manual_seed(3);
  Linear a2(64, 64), b2(64, 64);
  Conv2d c2({.in_channels = 3, .out_channels = 8, .kernel_size = {3, 3}});
  EXPECT_EQ(a.named_parameters()[0].second.to_vector(),
            a2.named_parameters()[0].second.to_vector());
  EXPECT_EQ(b.named_parameters()[1].second.to_vector(),
            b2.named_parameters()[1].second.to_vector());
  EXPECT_EQ(c.named_parameters()[0].second.to_vector(),
            c2.named_parameters()[0].second.to_vector());
  manual_seed(4);
  Linear other(64, 64);
  EXPECT_NE(a.named_parameters()[0].second.to_vector(),
            other.named_parameters()[0].second.to_vector());
}

}  // namespace
}  // namespace hsgd::nn
