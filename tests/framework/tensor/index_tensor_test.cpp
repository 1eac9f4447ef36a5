// IndexTensor (int64 ids and targets): shapes, views, exactness beyond float32's 2^24, and the
// ops that take it (embedding, cross_entropy, nll_loss) against PyTorch 1.13
// (tests/golden/generate_tensor_ops.py) and against the std::vector forms.

#include "framework/tensor/index_tensor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "comm/error.h"
#include "framework/nn/nn.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"
#include "tests/golden/golden.h"
#include "tests/support/error_message.h"

namespace hsgd {
namespace {

using golden::expect_close;
using ::testing::ElementsAre;
using testing::error_message;
using ::testing::HasSubstr;

// ---- the type ----

TEST(IndexTensorTest, ShapeAndValues_RowMajor) {
  IndexTensor ids({3, 14, 15, 92, 65, 35}, {2, 3});
  EXPECT_TRUE(ids.defined());
  EXPECT_EQ(ids.shape(), (Shape{2, 3}));
  EXPECT_EQ(ids.dim(), 2);
  EXPECT_EQ(ids.size(-1), 3);
  EXPECT_EQ(ids.numel(), 6);
  EXPECT_EQ(ids[4], 65);
  EXPECT_THAT(ids.to_vector(), ElementsAre(3, 14, 15, 92, 65, 35));
  EXPECT_EQ(IndexTensor({7, 8}).shape(), (Shape{2}));
  EXPECT_FALSE(IndexTensor().defined());
}

TEST(IndexTensorTest, HoldsIdsThatFloat32CannotRepresent) {
  const int64_t big = (int64_t{1} << 24) + 1;  // float32 rounds it to 2^24
  IndexTensor ids({big, big + 2});
  EXPECT_EQ(ids[0], big);
  EXPECT_NE(static_cast<int64_t>(ids.to_float().to_vector()[0]), big);
}

TEST(IndexTensorTest, ReshapeAndNarrow_AreTorchsViews) {
  IndexTensor ids({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
  EXPECT_EQ(ids.reshape({-1}).shape(), (Shape{12}));
  EXPECT_EQ(ids.reshape({2, -1, 2}).shape(), (Shape{2, 3, 2}));
  EXPECT_THAT(ids.narrow(0, 1, 2).to_vector(), ElementsAre(4, 5, 6, 7, 8, 9, 10, 11));
  EXPECT_THAT(ids.narrow(1, 1, 2).to_vector(), ElementsAre(1, 2, 5, 6, 9, 10));
  EXPECT_THAT(ids.narrow(0, 2, 1).reshape({2, 2}).narrow(-1, 1, 1).to_vector(), ElementsAre(9, 11));
  EXPECT_EQ(ids.narrow(0, 1, 0).numel(), 0);
}

TEST(IndexTensorTest, WrongShapesAreNamed) {
  EXPECT_THAT(error_message<InvalidArgument>([] {
                IndexTensor({1, 2, 3}, {2, 2});
              }),
              HasSubstr("shape [2, 2] holds 4 values, got 3"));
  EXPECT_THAT(error_message<InvalidArgument>([] {
                IndexTensor({}, {-1, 0});
              }),
              HasSubstr("invalid size -1"));
  IndexTensor ids({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_THAT(error_message<InvalidArgument>([&] {
                ids.reshape({4, 2});
              }),
              HasSubstr("shape [4, 2] (8 elements) is invalid for a tensor of shape [2, 3]"));
  EXPECT_THAT(error_message<InvalidArgument>([&] { ids.narrow(1, 2, 2); }),
              HasSubstr("[2, 4) is outside dim 1 of size 3"));
  EXPECT_THAT(error_message<InvalidArgument>([&] { ids[6]; }), HasSubstr("element 6"));
}

// ---- the ops that take it ----

TEST(IndexTensorOpsTest, Embedding_OutputHasTheIdsShape_GradientAddsUp) {
  Generator gen(3);
  Tensor weight = randn({5, 4}, gen).set_requires_grad(true);
  IndexTensor ids({4, 0, 4, 2, 1, 4}, {2, 3});
  Tensor out = embedding(weight, ids);
  EXPECT_EQ(out.shape(), (Shape{2, 3, 4}));
  Tensor same = embedding(weight.detach(), ids.to_vector(), ids.shape());
  expect_close(out.detach(), same, "out");
  sum(out).backward();
  const std::vector<float> g = weight.grad().to_vector();
  EXPECT_EQ(g[4 * 4], 3.0f);  // row 4 picked three times
  EXPECT_EQ(g[3 * 4], 0.0f);  // row 3 never
  nn::Embedding layer(5, 4, gen);
  EXPECT_EQ(layer.forward(ids).shape(), (Shape{2, 3, 4}));
  EXPECT_THAT(error_message<InvalidArgument>([&] { layer.forward(IndexTensor({5})); }),
              HasSubstr("index 0 is 5, expected a value in [0, 5)"));
}

TEST(IndexTensorOpsTest, CrossEntropy_MatchesPyTorch_ClassDimOneOfAKDimInput) {
  golden::File f("cross_entropy_kdim");
  const std::vector<float> t = f.tensor("targets").to_vector();
  IndexTensor targets(std::vector<int64_t>(t.begin(), t.end()), {2, 3});
  {
    Tensor x = f.leaf("plain.x");  // (2,5,3)
    Tensor loss = cross_entropy(x, targets);
    expect_close(loss, f.tensor("plain.out"), "plain.out");
    (loss * f.tensor("plain.gout")).backward();
    expect_close(x.grad(), f.tensor("plain.grad_x"), "plain.grad_x");
  }
  {
    Tensor x = f.leaf("options.x");
    Tensor loss = nn::cross_entropy(
        x, targets, {.weight = f.tensor("weight"), .ignore_index = 2, .label_smoothing = 0.1});
    expect_close(loss, f.tensor("options.out"), "options.out");
    (loss * f.tensor("options.gout")).backward();
    expect_close(x.grad(), f.tensor("options.grad_x"), "options.grad_x");
  }
}

TEST(IndexTensorOpsTest, CrossEntropyAndNllLoss_OfRows_EqualTheVectorForms) {
  Generator gen(5);
  Tensor logits = randn({6, 4}, gen);
  IndexTensor targets({3, 0, 1, 1, 2, 3});
  EXPECT_EQ(cross_entropy(logits, targets).item(),
            cross_entropy(logits, targets.to_vector()).item());
  Tensor logp = log_softmax(logits, 1);
  EXPECT_EQ(nll_loss(logp, targets).item(), nll_loss(logp, targets.to_vector()).item());
  // A GPT's (B,T,V) logits flattened to rows with the targets flattened alike.
  Tensor seq = randn({2, 3, 4}, gen);
  IndexTensor next({1, 2, 3, 0, 1, 2}, {2, 3});
  EXPECT_EQ(cross_entropy(seq.reshape({-1, 4}), next.reshape({-1})).item(),
            cross_entropy(seq.permute({0, 2, 1}), next).item());
}

TEST(IndexTensorOpsTest, CrossEntropy_ShapesThatDoNotMatchAreNamed) {
  Generator gen(5);
  Tensor logits = randn({2, 3, 4}, gen);
  EXPECT_THAT(error_message<InvalidArgument>([&] {
                cross_entropy(logits, IndexTensor({0, 1}, {2, 1}));
              }),
              HasSubstr("logits [2, 3, 4] and targets [2, 1] do not match"));
  EXPECT_THAT(error_message<InvalidArgument>([&] {
                cross_entropy(logits, IndexTensor({0, 1, 5, 0, 1, 2, 0, 1}, {2, 4}));
              }),
              HasSubstr("has target 5"));
}

}  // namespace
}  // namespace hsgd
