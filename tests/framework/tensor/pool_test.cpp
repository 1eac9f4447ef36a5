// max_pool2d, avg_pool2d, adaptive_avg_pool2d: forward against direct-loop definitions,
// backward against a numerical Jacobian, and the errors for bad input.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"
#include "tests/framework/tensor/grad_check.h"
#include "tests/framework/tensor/reference.h"

namespace hsgd {
namespace {

struct PoolCase {
  int64_t n, c, h, w, kh, kw, sh, sw, ph, pw;
};

std::string describe(const PoolCase& k) {
  return "x (" + std::to_string(k.n) + "," + std::to_string(k.c) + "," + std::to_string(k.h) + "," +
         std::to_string(k.w) + ") kernel (" + std::to_string(k.kh) + "," + std::to_string(k.kw) +
         ") stride (" + std::to_string(k.sh) + "," + std::to_string(k.sw) + ") padding (" +
         std::to_string(k.ph) + "," + std::to_string(k.pw) + ")";
}

const std::vector<PoolCase> kCases = {
    {1, 1, 4, 4, 2, 2, 2, 2, 0, 0}, {2, 3, 5, 7, 3, 3, 2, 2, 1, 1}, {1, 2, 7, 5, 3, 2, 1, 2, 1, 1},
    {3, 2, 6, 6, 2, 2, 1, 1, 0, 0}, {2, 1, 9, 9, 3, 3, 3, 3, 0, 0}, {1, 3, 8, 8, 3, 3, 2, 2, 1, 1},
};

// Distinct values spaced well apart (a shuffled ramp) so that a small perturbation never changes
// which element of a max window wins: the numerical Jacobian is then well defined.
Tensor distinct_values(Shape shape, Generator& gen) {
  const int64_t n = shape_numel(shape);
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.0f);
  for (int64_t i = n - 1; i > 0; --i) {
    std::swap(v[i], v[static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(i + 1)))]);
  }
  for (float& e : v) e = (e - n / 2.0f) * 0.1f;
  return from_vector(v, shape);
}

TEST(MaxPool2dTest, ForwardMatchesDirectDefinition) {
  Generator gen(11);
  for (const PoolCase& k : kCases) {
    Tensor x = randn({k.n, k.c, k.h, k.w}, gen);
    Tensor y = max_pool2d(x, {k.kh, k.kw}, {k.sh, k.sw}, {k.ph, k.pw});
    testing::expect_near_all(y.to_vector(),
                             testing::reference_pool2d(x.to_vector(), k.n * k.c, k.h, k.w, k.kh,
                                                       k.kw, k.sh, k.sw, k.ph, k.pw, true),
                             0, describe(k));
  }
}

TEST(MaxPool2dTest, GradientsMatchNumericalJacobian) {
  Generator gen(12);
  for (const PoolCase& k : kCases) {
    testing::check_gradients(describe(k),
                             [&](const std::vector<Tensor>& in) {
                               return max_pool2d(in[0], {k.kh, k.kw}, {k.sh, k.sw}, {k.ph, k.pw});
                             },
                             {distinct_values({k.n, k.c, k.h, k.w}, gen)});
  }
}

TEST(MaxPool2dTest, DefaultStrideIsKernel_ThreeDimInput) {
  Generator gen(13);
  Tensor x = randn({3, 6, 4}, gen);  // (C,H,W)
  Tensor y = max_pool2d(x, {2, 2});
  ASSERT_EQ(y.shape(), (Shape{3, 3, 2}));
  testing::expect_near_all(
      y.to_vector(), testing::reference_pool2d(x.to_vector(), 3, 6, 4, 2, 2, 2, 2, 0, 0, true), 0,
      "(C,H,W) input");
}

TEST(MaxPool2dTest, NaNInWindow_Propagates) {
  Tensor x = from_vector({1, NAN, 3, 4}, {1, 1, 2, 2});
  EXPECT_TRUE(std::isnan(max_pool2d(x, {2, 2}).item()));
}

TEST(AvgPool2dTest, ForwardMatchesDirectDefinition_CountIncludePad) {
  Generator gen(14);
  for (const PoolCase& k : kCases) {
    Tensor x = randn({k.n, k.c, k.h, k.w}, gen);
    Tensor y = avg_pool2d(x, {k.kh, k.kw}, {k.sh, k.sw}, {k.ph, k.pw});
    testing::expect_near_all(y.to_vector(),
                             testing::reference_pool2d(x.to_vector(), k.n * k.c, k.h, k.w, k.kh,
                                                       k.kw, k.sh, k.sw, k.ph, k.pw, false),
                             1e-6, describe(k));
  }
}

TEST(AvgPool2dTest, GradientsMatchNumericalJacobian) {
  Generator gen(15);
  for (const PoolCase& k : kCases) {
    testing::check_gradients(describe(k),
                             [&](const std::vector<Tensor>& in) {
                               return avg_pool2d(in[0], {k.kh, k.kw}, {k.sh, k.sw}, {k.ph, k.pw});
                             },
                             {randn({k.n, k.c, k.h, k.w}, gen)});
  }
}

struct AdaptiveCase {
  int64_t n, c, h, w, oh, ow;
};

// Divisible and non-divisible sizes (overlapping bins), output 1x1 (global average) and an
// output larger than the input.
const std::vector<AdaptiveCase> kAdaptiveCases = {
    {1, 1, 4, 4, 2, 2}, {2, 3, 5, 7, 3, 2}, {3, 2, 7, 5, 1, 1},
    {1, 2, 3, 3, 4, 5}, {2, 2, 8, 8, 3, 3}, {1, 1, 1, 1, 1, 1},
};

std::string describe(const AdaptiveCase& k) {
  return "x (" + std::to_string(k.n) + "," + std::to_string(k.c) + "," + std::to_string(k.h) + "," +
         std::to_string(k.w) + ") -> (" + std::to_string(k.oh) + "," + std::to_string(k.ow) + ")";
}

TEST(AdaptiveAvgPool2dTest, ForwardMatchesBinDefinition) {
  Generator gen(16);
  for (const AdaptiveCase& k : kAdaptiveCases) {
    Tensor x = randn({k.n, k.c, k.h, k.w}, gen);
    Tensor y = adaptive_avg_pool2d(x, {k.oh, k.ow});
    ASSERT_EQ(y.shape(), (Shape{k.n, k.c, k.oh, k.ow})) << describe(k);
    testing::expect_near_all(
        y.to_vector(),
        testing::reference_adaptive_avg_pool2d(x.to_vector(), k.n * k.c, k.h, k.w, k.oh, k.ow),
        1e-6, describe(k));
  }
}

TEST(AdaptiveAvgPool2dTest, GradientsMatchNumericalJacobian) {
  Generator gen(17);
  for (const AdaptiveCase& k : kAdaptiveCases) {
    testing::check_gradients(describe(k),
                             [&](const std::vector<Tensor>& in) {
                               return adaptive_avg_pool2d(in[0], {k.oh, k.ow});
                             },
                             {randn({k.n, k.c, k.h, k.w}, gen)});
  }
}

TEST(PoolTest, BadInput_ThrowsInvalidArgumentNamingValues) {
  Generator gen(18);
  Tensor x = randn({2, 3, 5, 5}, gen);
  testing::expect_invalid_argument([&] { max_pool2d(randn({5, 5}, gen), {2, 2}); }, "[5, 5]");
  testing::expect_invalid_argument([&] { max_pool2d(x, {7, 7}); }, "(7,7)");
  testing::expect_invalid_argument([&] { avg_pool2d(x, {2, 2}, {2, 2}, {2, 0}); }, "padding (2,0)");
  testing::expect_invalid_argument([&] { avg_pool2d(x, {0, 2}); }, "kernel (0,2)");
  testing::expect_invalid_argument([&] { max_pool2d(x, {2, 2}, {-1, 1}); }, "stride (-1,1)");
  testing::expect_invalid_argument([&] { adaptive_avg_pool2d(x, {0, 3}); }, "(0,3)");
  testing::expect_invalid_argument(
      [&] {
        adaptive_avg_pool2d(randn({2, 3}, gen), {1, 1});
      },
      "[2, 3]");
}

}  // namespace
}  // namespace hsgd
