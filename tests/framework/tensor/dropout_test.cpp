// dropout: statistics of the mask, scaling, eval identity, determinism per seed, gradient.

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "comm/error.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"
#include "tests/framework/tensor/grad_check.h"

namespace hsgd {
namespace {

TEST(DropoutTest, Training_ZeroFractionNearPAndSurvivorsScaled) {
  const int64_t n = 200000;
  for (double p : {0.1, 0.5, 0.8}) {
    Generator gen(31);
    Tensor x = full({n}, 2.0f);
    const std::vector<float> y = dropout(x, p, /*training=*/true, gen).to_vector();
    int64_t zeros = 0;
    const float survivor = static_cast<float>(2.0 / (1.0 - p));
    for (int64_t i = 0; i < n; ++i) {
      if (y[i] == 0.0f) {
        ++zeros;
      } else {
        ASSERT_FLOAT_EQ(y[i], survivor) << "p " << p << " index " << i;
      }
    }
    // The standard deviation of the zero fraction is sqrt(p(1-p)/n) < 0.0012: 0.01 is > 8 sigma.
    EXPECT_NEAR(double(zeros) / n, p, 0.01) << "p " << p;
  }
}

TEST(DropoutTest, EvalOrZeroP_ReturnsInputUnchanged) {
  Generator gen(32);
  Tensor x = randn({3, 4}, gen);
  Tensor eval = dropout(x, 0.5, /*training=*/false, gen);
  EXPECT_TRUE(eval.shares_storage_with(x));
  testing::expect_near_all(eval.to_vector(), x.to_vector(), 0, "eval");
  testing::expect_near_all(dropout(x, 0.0, true, gen).to_vector(), x.to_vector(), 0, "p = 0");
}

TEST(DropoutTest, SameSeed_SameMask_DifferentSeed_DifferentMask) {
  Tensor x = ones({1001});  // odd size: the last element takes its own draw
  Generator a(7), b(7), c(8);
  const std::vector<float> ya = dropout(x, 0.5, true, a).to_vector();
  const std::vector<float> yb = dropout(x, 0.5, true, b).to_vector();
  const std::vector<float> yc = dropout(x, 0.5, true, c).to_vector();
  EXPECT_EQ(ya, yb);
  EXPECT_NE(ya, yc);
  // Consecutive calls on one generator draw fresh masks.
  EXPECT_NE(dropout(x, 0.5, true, a).to_vector(), ya);
}

TEST(DropoutTest, Gradient_IsTheScaledMask) {
  Generator gen(33);
  Tensor x = randn({4, 5}, gen);
  x.set_requires_grad(true);
  Generator mask_gen(9);
  Tensor y = dropout(x, 0.4, true, mask_gen);
  sum(y).backward();
  Generator replay(9);
  const std::vector<float> mask = dropout(ones({4, 5}), 0.4, true, replay).to_vector();
  testing::expect_near_all(x.grad().to_vector(), mask, 0, "d sum(dropout(x)) / dx");
  // And the numerical Jacobian, with the generator re-seeded so every call draws the same mask.
  testing::check_gradients("dropout p=0.3",
                           [](const std::vector<Tensor>& in) {
                             Generator g(5);
                             return dropout(in[0], 0.3, true, g);
                           },
                           {randn({3, 7}, gen)});
}

TEST(DropoutTest, BadP_ThrowsInvalidArgumentNamingValue) {
  Generator gen(34);
  Tensor x = ones({4});
  testing::expect_invalid_argument([&] { dropout(x, 1.0, true, gen); }, "p = 1");
  testing::expect_invalid_argument([&] { dropout(x, -0.1, true, gen); }, "p = -0.1");
}

}  // namespace
}  // namespace hsgd
