// conv2d: forward against a direct-loop definition, backward against a numerical Jacobian,
// and the errors for bad shapes.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"
#include "tests/framework/tensor/grad_check.h"
#include "tests/framework/tensor/reference.h"

namespace hsgd {
namespace {

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw, sh, sw, ph, pw;
  bool bias;
};

std::string describe(const ConvCase& k) {
  return "x (" + std::to_string(k.n) + "," + std::to_string(k.c) + "," + std::to_string(k.h) + "," +
         std::to_string(k.w) + ") w (" + std::to_string(k.o) + "," + std::to_string(k.c) + "," +
         std::to_string(k.kh) + "," + std::to_string(k.kw) + ") stride (" + std::to_string(k.sh) +
         "," + std::to_string(k.sw) + ") padding (" + std::to_string(k.ph) + "," +
         std::to_string(k.pw) + ")" + (k.bias ? " bias" : "");
}

// Batch 1, odd sizes, stride 2, padding 1, rectangular kernels, 1x1 (the no-unfold path),
// batches whose small output maps are unfolded several samples at a time, and enough input
// channels for the transposed-conv input gradient.
const std::vector<ConvCase> kCases = {
    {1, 1, 5, 5, 1, 3, 3, 1, 1, 0, 0, true},
    {1, 3, 7, 5, 2, 3, 3, 2, 2, 1, 1, false},
    {2, 3, 7, 6, 4, 3, 3, 2, 2, 1, 1, true},
    {3, 2, 5, 5, 3, 1, 1, 1, 1, 0, 0, true},
    {2, 2, 5, 4, 3, 1, 1, 1, 1, 0, 0, false},
    {3, 2, 7, 7, 3, 1, 1, 2, 2, 0, 0, true},
    {2, 3, 9, 8, 2, 2, 3, 2, 1, 1, 0, true},
    {2, 2, 6, 6, 2, 5, 5, 3, 3, 2, 2, false},
    {2, 2, 3, 3, 2, 5, 5, 1, 1, 1, 1, true},
    {40, 2, 3, 3, 2, 3, 3, 1, 1, 1, 1, true},
    {33, 3, 2, 2, 2, 1, 1, 1, 1, 0, 0, false},
    // 16+ input channels at stride 1: both gradients come from one unfold of gy ...
    {2, 16, 5, 4, 3, 3, 3, 1, 1, 1, 1, true},
    {1, 17, 6, 5, 2, 3, 2, 1, 1, 0, 1, false},
    // ... unless padding >= kernel, which folds with col2im instead.
    {2, 16, 3, 3, 2, 1, 1, 1, 1, 1, 1, true},
    {1, 16, 3, 4, 3, 2, 2, 1, 1, 2, 1, false},
};

TEST(Conv2dTest, ForwardMatchesDirectDefinition) {
  Generator gen(1);
  for (const ConvCase& k : kCases) {
    Tensor x = randn({k.n, k.c, k.h, k.w}, gen);
    Tensor w = randn({k.o, k.c, k.kh, k.kw}, gen);
    Tensor b = k.bias ? randn({k.o}, gen) : Tensor();
    Tensor y = conv2d(x, w, b, {k.sh, k.sw}, {k.ph, k.pw});
    const std::vector<float> bias = k.bias ? b.to_vector() : std::vector<float>();
    const std::vector<float> expected =
        testing::reference_conv2d(x.to_vector(), w.to_vector(), k.bias ? &bias : nullptr, k.n, k.c,
                                  k.h, k.w, k.o, k.kh, k.kw, k.sh, k.sw, k.ph, k.pw);
    const int64_t oh = (k.h + 2 * k.ph - k.kh) / k.sh + 1;
    const int64_t ow = (k.w + 2 * k.pw - k.kw) / k.sw + 1;
    ASSERT_EQ(y.shape(), (Shape{k.n, k.o, oh, ow})) << describe(k);
    testing::expect_near_all(y.to_vector(), expected, 1e-5, describe(k));
  }
}

TEST(Conv2dTest, GradientsMatchNumericalJacobian) {
  Generator gen(2);
  for (const ConvCase& k : kCases) {
    if (k.n > 3) continue;  // the Jacobian of the blocked cases is checked below on a slice
    Tensor x = randn({k.n, k.c, k.h, k.w}, gen);
    Tensor w = randn({k.o, k.c, k.kh, k.kw}, gen);
    std::vector<Tensor> inputs = {x, w};
    if (k.bias) inputs.push_back(randn({k.o}, gen));
    testing::check_gradients(
        describe(k),
        [&](const std::vector<Tensor>& in) {
          return conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), {k.sh, k.sw}, {k.ph, k.pw});
        },
        inputs);
  }
}

TEST(Conv2dTest, GradientsMatchNumericalJacobian_BlockedSmallMaps) {
  // 9 samples with 2x2 output maps are unfolded as one block; the Jacobian is still exact.
  Generator gen(3);
  Tensor x = randn({9, 2, 2, 2}, gen);
  Tensor w = randn({3, 2, 3, 3}, gen);
  Tensor b = randn({3}, gen);
  testing::check_gradients("blocked 3x3",
                           [](const std::vector<Tensor>& in) {
                             return conv2d(in[0], in[1], in[2], {1, 1}, {1, 1});
                           },
                           {x, w, b});
  Tensor x1 = randn({9, 2, 2, 3}, gen);
  Tensor w1 = randn({3, 2, 1, 1}, gen);
  testing::check_gradients(
      "blocked 1x1", [](const std::vector<Tensor>& in) { return conv2d(in[0], in[1]); }, {x1, w1});
  // 16 channels: the blocked unfold of gy that gives both gradients.
  Tensor x2 = randn({9, 16, 2, 2}, gen);
  Tensor w2 = randn({3, 16, 3, 3}, gen);
  testing::check_gradients("blocked 3x3, 16 channels",
                           [](const std::vector<Tensor>& in) {
                             return conv2d(in[0], in[1], Tensor(), {1, 1}, {1, 1});
                           },
                           {x2, w2});
}

TEST(Conv2dTest, NonContiguousInput_SameAsContiguous) {
  Generator gen(4);
  Tensor x = randn({2, 3, 5, 4}, gen);
  Tensor w = randn({2, 3, 3, 3}, gen);
  Tensor xt = x.transpose(2, 3).contiguous().transpose(2, 3);  // same values, other strides
  ASSERT_FALSE(xt.is_contiguous());
  testing::expect_near_all(conv2d(xt, w, Tensor(), {1, 1}, {1, 1}).to_vector(),
                           conv2d(x, w, Tensor(), {1, 1}, {1, 1}).to_vector(), 1e-6, "strided x");
}

TEST(Conv2dTest, BadInput_ThrowsInvalidArgumentNamingValues) {
  Generator gen(5);
  Tensor x = randn({2, 3, 5, 5}, gen);
  Tensor w = randn({4, 3, 3, 3}, gen);
  testing::expect_invalid_argument([&] { conv2d(randn({3, 5, 5}, gen), w); }, "[3, 5, 5]");
  testing::expect_invalid_argument([&] { conv2d(x, randn({4, 2, 3, 3}, gen)); }, "channels");
  testing::expect_invalid_argument([&] { conv2d(x, randn({4, 3, 7, 7}, gen)); }, "(7,7)");
  testing::expect_invalid_argument([&] { conv2d(x, w, randn({3}, gen)); }, "[3]");
  testing::expect_invalid_argument([&] { conv2d(x, w, Tensor(), {0, 1}); }, "stride (0,1)");
  testing::expect_invalid_argument(
      [&] {
        conv2d(x, w, Tensor(), {1, 1}, {-1, 0});
      },
      "padding (-1,0)");
}

}  // namespace
}  // namespace hsgd
