// cross_entropy with weight / ignore_index / label_smoothing, nn::init and
// nn::utils::clip_grad_norm_ against PyTorch 1.13 (tests/golden/generate_nn_optim.py), and their
// errors for bad input.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/nn/nn.h"
#include "framework/tensor/ops.h"
#include "tests/golden/golden.h"
#include "tests/support/gradcheck.h"

namespace hsgd::nn {
namespace {

using golden::expect_close;

template <typename Fn>
void expect_invalid(Fn fn, std::initializer_list<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    for (const std::string& f : fragments) {
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "message '" << e.what() << "' lacks '" << f << "'";
    }
  }
}

// ---- cross_entropy ----

void check_cross_entropy(const std::string& name) {
  golden::File f(name);
  Tensor logits = f.tensor("logits");
  logits.set_requires_grad(true);
  std::vector<int64_t> targets;
  for (float v : f.entry("targets").values) targets.push_back(static_cast<int64_t>(v));
  CrossEntropyOptions options{.weight = f.has("weight") ? f.tensor("weight") : Tensor(),
                              .ignore_index = static_cast<int64_t>(f.scalar("ignore_index")),
                              .label_smoothing = f.scalar("label_smoothing")};
  Tensor loss = nn::cross_entropy(logits, targets, options);
  expect_close(loss, f.tensor("loss"), name + " loss");
  loss.backward();
  expect_close(logits.grad(), f.tensor("grad_logits"), name + " grad_logits");
}

TEST(CrossEntropyOptionsTest, ProducesPyTorchValues_Weight) { check_cross_entropy("ce_weight"); }
TEST(CrossEntropyOptionsTest, ProducesPyTorchValues_IgnoreIndex) {
  check_cross_entropy("ce_ignore");
}
TEST(CrossEntropyOptionsTest, ProducesPyTorchValues_DefaultIgnoreIndexMinus100) {
  check_cross_entropy("ce_ignore_default");
}
TEST(CrossEntropyOptionsTest, ProducesPyTorchValues_LabelSmoothing) {
  check_cross_entropy("ce_smoothing");
}
TEST(CrossEntropyOptionsTest, ProducesPyTorchValues_WeightIgnoreAndSmoothing) {
  check_cross_entropy("ce_all");
  check_cross_entropy("ce_weight_default_ignore_smoothing");
}

TEST(CrossEntropyOptionsTest, DefaultOptionsAreThePlainLossBitForBit) {
  golden::File f("cross_entropy");
  const Tensor logits = f.tensor("logits");
  const std::vector<int64_t> targets = f.targets("targets");
  EXPECT_EQ(nn::cross_entropy(logits, targets).item(), hsgd::cross_entropy(logits, targets).item());
  // Smoothing 0 with an ignored row equals the plain loss over the other rows.
  std::vector<int64_t> ignored = targets;
  ignored[0] = 7;
  const float partial = nn::cross_entropy(logits, ignored, {.ignore_index = 7}).item();
  const float rest = hsgd::cross_entropy(logits.narrow(0, 1, logits.size(0) - 1).contiguous(),
                                         {targets.begin() + 1, targets.end()})
                         .item();
  EXPECT_NEAR(partial, rest, 1e-6 * std::fabs(rest));
}

TEST(CrossEntropyOptionsTest, GradientsMatchNumerical) {
  Generator gen(8);
  Tensor logits = randn({5, 4}, gen).set_requires_grad(true);
  const Tensor weight = from_vector({0.5f, 1.5f, 1.0f, 2.0f});
  EXPECT_TRUE(testing::expect_gradients_match(
      [&](const std::vector<Tensor>& in) {
        return nn::cross_entropy(in[0], {0, 3, 1, 2, 3},
                                 {.weight = weight, .ignore_index = 1, .label_smoothing = 0.2});
      },
      {logits}));
}

TEST(CrossEntropyOptionsTest, RejectsBadInput_NamingIt) {
  const Tensor logits = zeros({2, 3});
  // The default options take the plain path, which checks in cross_entropy's name, not
  // nll_loss's: the message names the function called, the sample and the number of classes.
  expect_invalid(
      [&] {
        nn::cross_entropy(logits, {0, 3});
      },
      {"cross_entropy: sample 1 of the batch of 2 has target 3", "expected a class index in [0, 3)",
       "(the input has 3 classes)"});
  expect_invalid(
      [&] {
        hsgd::cross_entropy(logits, {7, 0});
      },
      {"cross_entropy: sample 0 of the batch of 2 has target 7"});
  expect_invalid(
      [&] {
        nn::nll_loss(logits, {0, -2});
      },
      {"nll_loss: sample 1 of the batch of 2 has target -2"});
  expect_invalid(
      [&] {
        nn::cross_entropy(logits, {0, -1}, {.ignore_index = 2});
      },
      {"cross_entropy: sample 1 of the batch of 2 has target -1", "or ignore_index 2"});
  expect_invalid(
      [&] {
        nn::cross_entropy(logits, {0, 1}, {.weight = ones({2})});
      },
      {"weight has shape [2]", "[3]"});
  expect_invalid(
      [&] {
        nn::cross_entropy(logits, {0, 1}, {.label_smoothing = 1.5});
      },
      {"label_smoothing 1.5", "[0, 1]"});
  expect_invalid([&] { nn::cross_entropy(logits, {0}); }, {"1 targets", "batch of 2"});
}

TEST(CrossEntropyOptionsTest, BadTarget_NamesItsDatasetIndexWhenGiven) {
  const std::vector<int64_t> dataset_indices{40, 41, 4711, 43};
  expect_invalid(
      [&] {
        check_class_targets("cross_entropy", {0, 1, 10, 2}, 10, std::nullopt, dataset_indices);
      },
      {"cross_entropy: sample 2 of the batch of 4 (dataset index 4711) has target 10", "[0, 10)",
       "10 classes"});
  // Indices that do not match the batch are not quoted (they would name the wrong sample).
  try {
    check_class_targets("cross_entropy", {0, 10}, 10, std::nullopt, dataset_indices);
    ADD_FAILURE() << "no exception for target 10 of 10 classes";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()).find("dataset index"), std::string::npos) << e.what();
  }
  check_class_targets("cross_entropy", {0, -100, 9}, 10, -100, dataset_indices);  // no throw
}

// ---- init ----

double empirical_std(const Tensor& t) {
  const std::vector<float> v = t.to_vector();
  double mean = 0, sq = 0;
  for (float x : v) mean += x;
  mean /= static_cast<double>(v.size());
  for (float x : v) sq += (x - mean) * (x - mean);
  return std::sqrt(sq / static_cast<double>(v.size() - 1));
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (float x : t.to_vector()) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

TEST(InitTest, GainsMatchPyTorch) {
  golden::File f("init");
  using init::Nonlinearity;
  EXPECT_NEAR(init::calculate_gain(Nonlinearity::kLinear), f.scalar("gain_linear"), 1e-6);
  EXPECT_NEAR(init::calculate_gain(Nonlinearity::kReLU), f.scalar("gain_relu"), 1e-6);
  EXPECT_NEAR(init::calculate_gain(Nonlinearity::kTanh), f.scalar("gain_tanh"), 1e-6);
  EXPECT_NEAR(init::calculate_gain(Nonlinearity::kSigmoid), f.scalar("gain_sigmoid"), 1e-6);
  EXPECT_NEAR(init::calculate_gain(Nonlinearity::kLeakyReLU), f.scalar("gain_leaky_relu_default"),
              1e-6);
  EXPECT_NEAR(init::calculate_gain(Nonlinearity::kLeakyReLU, 0.2), f.scalar("gain_leaky_relu_0.2"),
              1e-6);
  EXPECT_NEAR(init::calculate_gain(Nonlinearity::kSELU), f.scalar("gain_selu"), 1e-6);
}

// Draws with hsgd's defaults on the shapes torch used and checks fans, the spread (std within 3%
// for >= 9000 draws) and that uniform draws reach but never exceed torch's bound.
void check_init_case(const golden::File& f, const std::string& name) {
  Shape shape;
  for (float v : f.entry(name + ".shape").values) shape.push_back(static_cast<int64_t>(v));
  Tensor t = empty(shape);
  const auto [fan_in, fan_out] = init::calculate_fan_in_and_fan_out(t);
  EXPECT_EQ(fan_in, static_cast<int64_t>(f.scalar(name + ".fan_in"))) << name;
  EXPECT_EQ(fan_out, static_cast<int64_t>(f.scalar(name + ".fan_out"))) << name;
  Generator gen(21);

  init::kaiming_normal_(t, gen);
  EXPECT_NEAR(empirical_std(t), f.scalar(name + ".kaiming_normal_std"),
              0.03 * f.scalar(name + ".kaiming_normal_std"))
      << name << " kaiming_normal_";
  // torch's own draw agrees with the formula the test uses.
  EXPECT_NEAR(f.scalar(name + ".torch_kaiming_normal_empirical_std"),
              f.scalar(name + ".kaiming_normal_std"),
              0.03 * f.scalar(name + ".kaiming_normal_std"));

  init::kaiming_normal_(t, gen, 0, init::FanMode::kFanOut, init::Nonlinearity::kReLU);
  EXPECT_NEAR(empirical_std(t), f.scalar(name + ".kaiming_normal_relu_fan_out_std"),
              0.03 * f.scalar(name + ".kaiming_normal_relu_fan_out_std"))
      << name << " kaiming_normal_ fan_out relu";

  auto check_uniform = [&](const std::string& key, const std::string& what) {
    const double bound = f.scalar(name + "." + key);
    EXPECT_LE(max_abs(t), bound * (1 + 1e-6)) << name << " " << what;
    EXPECT_GE(max_abs(t), 0.99 * bound) << name << " " << what;
    EXPECT_NEAR(empirical_std(t), bound / std::sqrt(3.0), 0.03 * bound) << name << " " << what;
  };
  init::kaiming_uniform_(t, gen);
  check_uniform("kaiming_uniform_bound", "kaiming_uniform_");
  EXPECT_NEAR(f.scalar(name + ".torch_kaiming_uniform_empirical_max"),
              f.scalar(name + ".kaiming_uniform_bound"),
              0.01 * f.scalar(name + ".kaiming_uniform_bound"));
  init::kaiming_uniform_(t, gen, std::sqrt(5.0));
  check_uniform("kaiming_uniform_a5_bound", "kaiming_uniform_ a=sqrt(5)");
  init::xavier_uniform_(t, gen);
  check_uniform("xavier_uniform_bound", "xavier_uniform_");
  init::xavier_uniform_(t, gen, 2.0);
  check_uniform("xavier_uniform_gain2_bound", "xavier_uniform_ gain 2");
}

TEST(InitTest, DistributionsMatchPyTorchFormulas_Linear) {
  check_init_case(golden::File("init"), "linear");
}

TEST(InitTest, DistributionsMatchPyTorchFormulas_Conv) {
  check_init_case(golden::File("init"), "conv");
}

TEST(InitTest, FillsParametersInPlaceWithoutHistory) {
  Generator gen(2);
  Linear fc(4, 3, true, gen);
  Tensor w = fc.weight();
  init::ones_(w);
  for (float v : fc.weight().to_vector()) EXPECT_EQ(v, 1.0f);
  Tensor b = fc.bias();
  init::zeros_(b);
  for (float v : fc.bias().to_vector()) EXPECT_EQ(v, 0.0f);
  init::kaiming_uniform_(w, gen);
  EXPECT_TRUE(fc.weight().is_leaf());
  EXPECT_TRUE(fc.weight().requires_grad());
  EXPECT_GT(max_abs(fc.weight()), 0.0);
}

TEST(InitTest, RejectsTensorsWithoutFans) {
  Generator gen(0);
  Tensor v = zeros({5});
  expect_invalid([&] { init::kaiming_normal_(v, gen); }, {"at least 2 dimensions", "[5]"});
  expect_invalid([&] { init::xavier_uniform_(v, gen); }, {"at least 2 dimensions"});
  Tensor m = zeros({3, 4});
  expect_invalid([&] { init::xavier_uniform_(m, gen, -1); }, {"gain -1"});
}

// ---- clip_grad_norm_ ----

TEST(ClipGradNormTest, ProducesPyTorchValues) {
  golden::File f("clip_grad_norm");
  for (const char* norm : {"l2", "l1", "l3", "linf"}) {
    for (const char* size : {"small", "large"}) {
      const std::string key = std::string(norm) + "_" + size;
      std::vector<Tensor> params;
      for (int i = 0; i < 3; ++i) {
        const Tensor g = f.tensor("grad" + std::to_string(i));
        Tensor p = zeros(g.shape()).set_requires_grad(true);
        p.set_grad(g);
        params.push_back(p);
      }
      params.push_back(zeros({2}).set_requires_grad(true));  // no gradient: skipped
      const double norm_type = f.scalar(key + ".norm_type") < 0
                                   ? std::numeric_limits<double>::infinity()
                                   : f.scalar(key + ".norm_type");
      const double total = utils::clip_grad_norm_(params, f.scalar(key + ".max_norm"), norm_type);
      EXPECT_NEAR(total, f.scalar(key + ".total_norm"), 1e-5 * f.scalar(key + ".total_norm"))
          << key;
      for (int i = 0; i < 3; ++i) {
        expect_close(params[i].grad(), f.tensor(key + ".clipped" + std::to_string(i)),
                     key + " clipped grad " + std::to_string(i));
      }
      EXPECT_FALSE(params[3].grad().defined());
    }
  }
}

TEST(ClipGradNormTest, NoGradientsGivesZero) {
  std::vector<Tensor> params = {zeros({3}).set_requires_grad(true)};
  EXPECT_EQ(utils::clip_grad_norm_(params, 1.0), 0.0);
}

TEST(ClipGradNormTest, NonFiniteNorm_ErrorsOnlyWhenAsked) {
  Tensor p = zeros({2}).set_requires_grad(true);
  p.set_grad(from_vector({1.0f, std::numeric_limits<float>::infinity()}));
  expect_invalid([&] { utils::clip_grad_norm_({p}, 1.0, 2.0, true); }, {"total norm", "inf"});
  EXPECT_EQ(p.grad().to_vector()[0], 1.0f);  // untouched by the failed call
  EXPECT_TRUE(std::isinf(utils::clip_grad_norm_({p}, 1.0)));
}

TEST(ClipGradNormTest, RejectsBadArguments) {
  Tensor p = zeros({2}).set_requires_grad(true);
  p.set_grad(ones({2}));
  expect_invalid([&] { utils::clip_grad_norm_({p}, -1.0); }, {"max_norm -1"});
  expect_invalid([&] { utils::clip_grad_norm_({p}, 1.0, 0.0); }, {"norm_type 0"});
  expect_invalid([&] { utils::clip_grad_norm_({p}, 1.0, -2.0); }, {"norm_type -2"});
}

}  // namespace
}  // namespace hsgd::nn
