// LayerNorm, GELU, SiLU, BatchNorm1d, Embedding and ModuleList: forward outputs and gradients
// against PyTorch 1.13 (tests/golden/generate_nn_optim.py), numerical Jacobians, registration
// names and the errors for bad input.

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "comm/error.h"
#include "framework/nn/nn.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"
#include "tests/framework/nn/layer_golden.h"
#include "tests/golden/golden.h"
#include "tests/support/gradcheck.h"

namespace hsgd::nn {
namespace {

using golden::expect_close;
using testing::check_forward_backward;
using testing::leaf;

// Expects InvalidArgument whose message contains every fragment.
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

// ---- LayerNorm ----

TEST(LayerNormTest, ProducesPyTorchValues_AffineOverTwoDims) {
  golden::File f("layer_norm_affine");
  LayerNorm norm({4, 5});
  norm.load_state_dict({{"weight", f.tensor("weight")}, {"bias", f.tensor("bias")}});
  check_forward_backward(norm, f, "layer_norm affine");
  expect_close(norm.weight().grad(), f.tensor("grad_weight"), "layer_norm grad_weight");
  expect_close(norm.bias().grad(), f.tensor("grad_bias"), "layer_norm grad_bias");
}

TEST(LayerNormTest, ProducesPyTorchValues_WithoutAffine) {
  golden::File f("layer_norm_plain");
  LayerNorm norm({6}, {.eps = 1e-3, .elementwise_affine = false});
  EXPECT_TRUE(norm.named_parameters().empty());
  check_forward_backward(norm, f, "layer_norm plain");
}

TEST(LayerNormTest, GradientsMatchNumerical) {
  Generator gen(3);
  Tensor x = randn({3, 2, 4}, gen).set_requires_grad(true);
  Tensor w = (randn({2, 4}, gen) + 1.0f).set_requires_grad(true);
  Tensor b = randn({2, 4}, gen).set_requires_grad(true);
  EXPECT_TRUE(testing::expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        return layer_norm(in[0], {2, 4}, in[1], in[2]);
      },
      {x, w, b}));
}

TEST(LayerNormTest, RejectsBadShapes_NamingThem) {
  LayerNorm norm({4, 5});
  Generator gen(0);
  expect_invalid(
      [&] {
        norm.forward(randn({3, 5, 4}, gen));
      },
      {"[3, 5, 4]", "normalized_shape [4, 5]"});
  expect_invalid([&] { norm.forward(randn({5}, gen)); }, {"[5]", "[4, 5]"});
  expect_invalid([] { LayerNorm({}); }, {"normalized_shape must not be empty"});
  expect_invalid([] { LayerNorm({3, 0}); }, {"size 0"});
  expect_invalid([] { LayerNorm({3}, {.eps = -1}); }, {"eps -1"});
}

// ---- GELU, SiLU ----

TEST(GELUTest, ProducesPyTorchValues_Exact) {
  GELU gelu;
  check_forward_backward(gelu, golden::File("gelu_none"), "gelu none");
}

TEST(GELUTest, ProducesPyTorchValues_Tanh) {
  GELU gelu({.approximate = "tanh"});
  check_forward_backward(gelu, golden::File("gelu_tanh"), "gelu tanh");
}

TEST(GELUTest, GradientsMatchNumerical) {
  Generator gen(4);
  Tensor x = mul(randn({4, 5}, gen), 2.0f).set_requires_grad(true);
  for (const char* approximate : {"none", "tanh"}) {
    EXPECT_TRUE(testing::expect_gradients_match(
        [&](const std::vector<Tensor>& in) { return gelu(in[0], approximate); }, {x}))
        << approximate;
  }
}

TEST(GELUTest, RejectsUnknownApproximation) {
  expect_invalid([] { GELU({.approximate = "erf"}); }, {"'erf'", "'none' or 'tanh'"});
}

TEST(SiLUTest, ProducesPyTorchValues) {
  SiLU silu;
  check_forward_backward(silu, golden::File("silu"), "silu");
}

TEST(SiLUTest, GradientsMatchNumerical) {
  Generator gen(5);
  Tensor x = mul(randn({3, 6}, gen), 3.0f).set_requires_grad(true);
  EXPECT_TRUE(testing::expect_gradients_match(
      [](const std::vector<Tensor>& in) { return silu(in[0]); }, {x}));
}

// ---- BatchNorm1d ----

void check_batchnorm1d_train(const std::string& name) {
  golden::File f(name);
  BatchNorm1d bn(3, 1e-5, 0.2);
  bn.load_state_dict({{"weight", f.tensor("weight")},
                      {"bias", f.tensor("bias")},
                      {"running_mean", f.tensor("running_mean0")},
                      {"running_var", f.tensor("running_var0")},
                      {"num_batches_tracked", zeros({})}});
  check_forward_backward(bn, f, name);
  expect_close(bn.weight().grad(), f.tensor("grad_weight"), name + " grad_weight");
  expect_close(bn.bias().grad(), f.tensor("grad_bias"), name + " grad_bias");
  expect_close(bn.running_mean(), f.tensor("running_mean"), name + " running_mean");
  expect_close(bn.running_var(), f.tensor("running_var"), name + " running_var");
  EXPECT_EQ(bn.num_batches_tracked().item(), 1.0f);
}

TEST(BatchNorm1dTest, ProducesPyTorchValues_TrainingNC) {
  check_batchnorm1d_train("batchnorm1d_train_nc");
}

TEST(BatchNorm1dTest, ProducesPyTorchValues_TrainingNCL) {
  check_batchnorm1d_train("batchnorm1d_train_ncl");
}

TEST(BatchNorm1dTest, ProducesPyTorchValues_EvalNCL) {
  golden::File f("batchnorm1d_eval_ncl");
  BatchNorm1d bn(2);
  bn.load_state_dict({{"weight", f.tensor("weight")},
                      {"bias", f.tensor("bias")},
                      {"running_mean", f.tensor("running_mean")},
                      {"running_var", f.tensor("running_var")},
                      {"num_batches_tracked", zeros({})}});
  bn.eval();
  check_forward_backward(bn, f, "bn1d eval");
  expect_close(bn.weight().grad(), f.tensor("grad_weight"), "bn1d eval grad_weight");
  expect_close(bn.running_mean(), f.tensor("running_mean"), "bn1d eval running_mean unchanged");
  EXPECT_EQ(bn.num_batches_tracked().item(), 0.0f);
}

TEST(BatchNorm1dTest, StateDictNamesMatchTorch) {
  BatchNorm1d bn(4);
  std::vector<std::string> names;
  for (const auto& [name, t] : bn.state_dict()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias", "running_mean", "running_var",
                                             "num_batches_tracked"}));
}

TEST(BatchNorm1dTest, RejectsBadInput_NamingIt) {
  BatchNorm1d bn(3);
  Generator gen(0);
  expect_invalid(
      [&] {
        bn.forward(randn({2, 3, 4, 4}, gen));
      },
      {"(N,C) or (N,C,L)", "[2, 3, 4, 4]"});
  expect_invalid([&] { bn.forward(randn({2, 5}, gen)); }, {"5 channels", "num_features = 3"});
  expect_invalid([] { BatchNorm1d(0); }, {"num_features 0"});
  // Training statistics need more than one value per channel, as torch.
  EXPECT_THROW(bn.forward(randn({1, 3}, gen)), InvalidArgument);
}

// ---- Embedding ----

TEST(EmbeddingTest, ProducesPyTorchValues_WithRepeatedIndices) {
  golden::File f("embedding");
  Generator gen(0);
  Embedding emb(7, 3, gen);
  emb.load_state_dict({{"weight", f.tensor("weight")}});
  Tensor out = emb.forward(f.targets("indices"), f.entry("indices").shape);
  expect_close(out, f.tensor("out"), "embedding out");
  sum(mul(out, f.tensor("gout"))).backward();
  expect_close(emb.weight().grad(), f.tensor("grad_weight"), "embedding grad_weight");
}

TEST(EmbeddingTest, TensorIndicesGiveTheSameRows) {
  golden::File f("embedding");
  Embedding emb(7, 3);
  emb.load_state_dict({{"weight", f.tensor("weight")}});
  // The float tensor of indices as written by the generator, with its (2,4) shape.
  Tensor out = emb.forward(f.tensor("indices"));
  expect_close(out, f.tensor("out"), "embedding out from a tensor");
  EXPECT_EQ(emb.named_parameters().at(0).first, "weight");
}

TEST(EmbeddingTest, InitialWeightsAreStandardNormal) {
  Generator gen(11);
  Embedding emb(400, 50, gen);
  const std::vector<float> w = emb.weight().to_vector();
  double mean = 0, sq = 0;
  for (float v : w) mean += v;
  mean /= static_cast<double>(w.size());
  for (float v : w) sq += (v - mean) * (v - mean);
  const double std = std::sqrt(sq / static_cast<double>(w.size()));
  EXPECT_NEAR(mean, 0.0, 0.02);  // 20000 draws: standard error 0.007
  EXPECT_NEAR(std, 1.0, 0.02);
}

TEST(EmbeddingTest, RejectsOutOfRangeIndex_NamingPositionAndValue) {
  Embedding emb(5, 2);
  expect_invalid([&] { emb.forward({1, 4, 5}, {3}); }, {"index 2 is 5", "[0, 5)"});
  expect_invalid([&] { emb.forward({1, -1}, {2}); }, {"index 1 is -1"});
  expect_invalid([&] { emb.forward({1, 2, 3}, {2, 2}); }, {"[2, 2]", "3 indices"});
  expect_invalid([&] { emb.forward(from_vector({0.5f}, {1})); }, {"0.5"});
  expect_invalid([] { Embedding(0, 3); }, {"num_embeddings 0"});
}

// ---- ModuleList ----

TEST(ModuleListTest, RegistersChildrenByPosition) {
  auto list = std::make_shared<ModuleList>();
  list->push_back(std::make_shared<Linear>(3, 4));
  list->push_back(std::make_shared<GELU>());
  auto last = list->push_back(std::make_shared<LayerNorm>(std::vector<int64_t>{4}));
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[2].get(), last.get());
  EXPECT_NE(list->get<Linear>(0), nullptr);
  EXPECT_EQ(list->get<Linear>(1), nullptr);
  std::vector<std::string> names;
  for (const auto& [name, t] : list->named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));

  // Nested under a parent, as torch names "blocks.0.weight".
  Module parent("Parent");
  parent.register_module("blocks", list);
  EXPECT_EQ(parent.named_parameters().at(0).first, "blocks.0.weight");
  size_t visited = 0;
  for (const auto& m : *list) visited += m != nullptr;
  EXPECT_EQ(visited, 3u);
  list->eval();
  EXPECT_FALSE((*list)[0]->is_training());
}

TEST(ModuleListTest, RejectsBadIndexAndNull) {
  ModuleList list;
  list.push_back(std::make_shared<SiLU>());
  expect_invalid([&] { (void)list[1]; }, {"index 1", "size 1"});
  expect_invalid([&] { list.push_back(std::shared_ptr<Module>()); }, {"null"});
  EXPECT_THROW(list.forward(zeros({1})), Error);
}

}  // namespace
}  // namespace hsgd::nn
