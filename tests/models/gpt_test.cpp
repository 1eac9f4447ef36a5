// models::GPT: logits, loss and every parameter's gradient against its PyTorch twin
// (models/gpt_torch.py via tests/golden/generate_gpt.py), parameter names and count, sampling,
// and the errors for bad options and ids.

#include "models/gpt.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/tensor/ops.h"
#include "tests/golden/golden.h"
#include "tests/support/error_message.h"

namespace hsgd::models {
namespace {

using golden::expect_close;
using testing::error_message;
using ::testing::HasSubstr;

IndexTensor ids_of(const Tensor& t) {
  const std::vector<float> v = t.to_vector();
  return IndexTensor(std::vector<int64_t>(v.begin(), v.end()), t.shape());
}

TEST(GPTTest, MatchesPyTorch_LogitsLossAndEveryGradient) {
  golden::File f("gpt_small");
  GPT gpt(
      {.vocab_size = 11, .context = 8, .d_model = 8, .n_layers = 2, .n_heads = 2, .dropout = 0.0});
  nn::NamedTensors state;
  for (const auto& [name, p] : gpt.named_parameters()) {
    state.emplace_back(name, f.tensor("param." + name));
  }
  gpt.load_state_dict(state);  // also checks that every torch name exists here, and no other
  const Tensor logits = gpt.forward(ids_of(f.tensor("ids")));
  expect_close(logits, f.tensor("logits"), "logits");
  Tensor loss = cross_entropy(logits.reshape({-1, 11}), ids_of(f.tensor("targets")).reshape({-1}));
  expect_close(loss, f.tensor("loss"), "loss");
  loss.backward();
  for (const auto& [name, p] : gpt.named_parameters()) {
    expect_close(p.grad(), f.tensor("grad." + name), "grad." + name);
  }
}

TEST(GPTTest, Parameters_HaveTorchsNamesAndCount) {
  const GPTOptions o{
      .vocab_size = 256, .context = 128, .d_model = 128, .n_layers = 4, .n_heads = 4};
  GPT gpt(o);
  const int64_t c = o.d_model;
  const int64_t block =
      2 * 2 * c + (3 * c * c + 3 * c) + (c * c + c) + (4 * c * c + 4 * c) + (4 * c * c + c);
  const int64_t expected =
      o.vocab_size * c + o.context * c + o.n_layers * block + 2 * c + o.vocab_size * c;
  int64_t count = 0;
  std::vector<std::string> names;
  for (const auto& [name, p] : gpt.named_parameters()) {
    count += p.numel();
    names.push_back(name);
  }
  EXPECT_EQ(count, expected);
  EXPECT_EQ(names.front(), "wte.weight");
  EXPECT_THAT(names, ::testing::Contains("blocks.3.mlp.c_proj.bias"));
  EXPECT_EQ(names.back(), "lm_head.weight");
}

TEST(GPTTest, Generate_IsSeededAndStaysInTheVocabulary) {
  GPT gpt({.vocab_size = 7, .context = 4, .d_model = 8, .n_layers = 1, .n_heads = 2, .seed = 3});
  Generator a(5), b(5);
  const std::vector<int64_t> one = gpt.generate({1, 2}, 10, a);
  EXPECT_EQ(one, gpt.generate({1, 2}, 10, b));  // prompts longer than the context are cut
  ASSERT_EQ(one.size(), 10u);
  for (int64_t t : one) EXPECT_TRUE(t >= 0 && t < 7) << t;
  EXPECT_TRUE(gpt.is_training());  // generate() restores the mode
}

TEST(GPTTest, BadOptionsAndIds_AreNamed) {
  EXPECT_THAT(error_message<InvalidArgument>([] { GPT({.d_model = 10, .n_heads = 4}); }),
              HasSubstr("d_model 10 must be divisible by n_heads 4"));
  GPT gpt({.vocab_size = 5, .context = 4, .d_model = 4, .n_layers = 1, .n_heads = 1});
  EXPECT_THAT(error_message<InvalidArgument>([&] {
                gpt.forward(IndexTensor(std::vector<int64_t>(10, 0), {2, 5}));
              }),
              HasSubstr("1 <= T <= context 4, got [2, 5]"));
  EXPECT_THAT(error_message<InvalidArgument>([&] {
                gpt.forward(IndexTensor({0, 9}, {1, 2}));
              }),
              HasSubstr("is 9, expected a value in [0, 5)"));
}

}  // namespace
}  // namespace hsgd::models
