// vecmath's exp, GELU (exact and tanh) and SiLU, forward and backward, against double-precision
// references over a dense sweep of inputs and the edge cases (0, -0, subnormals, the overflow
// and underflow thresholds, +-inf, NaN), on every instruction-set path this CPU can run. Each
// sweep prints its maximum error in ulps (of the reference, or for a backward of the larger of
// its two terms, since gelu' and silu' cross zero where a relative error is meaningless). The row
// kernels (max, scale, dot, softmax backward, LayerNorm forward and backward) are checked on every
// tail length against the scalar loop's bits or a double-precision row.

#include "framework/kernels/vec_math.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace hsgd::kernels {
namespace {

using simd::Isa;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kSqrtHalf = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kSqrt2OverPi = 0.79788456080286535588;

// One float ulp at magnitude |r| (2^-149 for subnormals).
double ulp(double r) {
  r = std::fabs(r);
  if (r < std::numeric_limits<float>::min()) return std::ldexp(1.0, -149);
  int e = 0;
  std::frexp(r, &e);
  return std::ldexp(1.0, e - 24);
}

// Inputs in [lo, hi]: `count` evenly spaced points, and for each sign 2000 magnitudes spaced
// evenly in log from 1e-30 to the range's edge, plus every edge value inside the range.
std::vector<float> sweep(double lo, double hi, int count) {
  std::vector<float> x;
  for (int i = 0; i <= count; ++i) x.push_back(static_cast<float>(lo + (hi - lo) * i / count));
  for (int i = 0; i <= 2000; ++i) {
    const double m = std::pow(10.0, -30.0 + 32.0 * i / 2000.0);
    if (m <= hi) x.push_back(static_cast<float>(m));
    if (-m >= lo) x.push_back(static_cast<float>(-m));
  }
  for (float e :
       {0.0f, -0.0f, 1e-45f, -1e-45f, 1e-38f, -1e-38f, 1.17549435e-38f, 0.5f, -0.5f, 1.0f, -1.0f}) {
    if (e >= lo && e <= hi) x.push_back(e);
  }
  return x;
}

// The largest error of `actual` against `reference` in ulps of scale[i] (the reference itself
// when scale is empty), printed as a table row and returned.
struct Worst {
  double ulps = 0;
  float x = 0;
  double expected = 0, actual = 0;
};

Worst measure(const std::vector<float>& x, const std::vector<float>& actual,
              const std::vector<double>& reference, const std::vector<double>& scale) {
  Worst w;
  for (size_t i = 0; i < x.size(); ++i) {
    const double s = scale.empty() ? reference[i] : scale[i];
    const double err = std::fabs(actual[i] - reference[i]) / ulp(s);
    if (!(err <= w.ulps)) w = {err, x[i], reference[i], actual[i]};
  }
  return w;
}

void report(const char* what, Isa isa, const Worst& w, double bound) {
  std::printf("  %-20s %-8s max %7.3f ulp (bound %g) at x = %.9g: expected %.9g, got %.9g\n", what,
              simd::isa_name(isa), w.ulps, bound, w.x, w.expected, w.actual);
  EXPECT_LE(w.ulps, bound) << what << " on " << simd::isa_name(isa) << " at x = " << w.x
                           << ": expected " << w.expected << ", got " << w.actual;
}

// Calls a forward op, or a backward op with gradient 1.
using Forward = void (*)(const float*, float*, int64_t, Isa);
using Backward = void (*)(const float*, const float*, float*, int64_t, Isa);

std::vector<float> run(Forward f, const std::vector<float>& x, Isa isa) {
  std::vector<float> y(x.size());
  f(x.data(), y.data(), static_cast<int64_t>(x.size()), isa);
  return y;
}

std::vector<float> run(Backward f, const std::vector<float>& x, Isa isa) {
  const std::vector<float> g(x.size(), 1.0f);
  std::vector<float> y(x.size());
  f(g.data(), x.data(), y.data(), static_cast<int64_t>(x.size()), isa);
  return y;
}

// ---- double references ----

double gelu_ref(double x) { return 0.5 * x * std::erfc(-x * kSqrtHalf); }
double gelu_cdf(double x) { return 0.5 * std::erfc(-x * kSqrtHalf); }
double gelu_xpdf(double x) { return x * kInvSqrt2Pi * std::exp(-0.5 * x * x); }
double sigmoid_ref(double v) {
  return v >= 0 ? 1 / (1 + std::exp(-v)) : std::exp(v) / (1 + std::exp(v));
}
double tanh_v(double x) { return 2 * kSqrt2OverPi * (x + 0.044715 * x * x * x); }
double tanh_dv(double x) { return 2 * kSqrt2OverPi * (1 + 3 * 0.044715 * x * x); }

class VecMathTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!simd::isa_supported(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run " << simd::isa_name(GetParam()) << " (it supports "
                   << simd::isa_name(simd::conv_isa()) << ")";
    }
  }
};

// Runs f on x and compares every element with ref, in ulps of scale(x) (of ref when null).
void check(const char* what, const std::vector<float>& x, const std::vector<float>& y,
           const std::function<double(double)>& ref, const std::function<double(double)>& scale,
           double bound, Isa isa) {
  std::vector<double> r(x.size()), s;
  for (size_t i = 0; i < x.size(); ++i) r[i] = ref(x[i]);
  if (scale) {
    s.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) s[i] = scale(x[i]);
  }
  report(what, isa, measure(x, y, r, s), bound);
}

TEST_P(VecMathTest, ExpWithinOneAndAHalfUlp_Sweep) {
  const Isa isa = GetParam();
  // Down to -103.97 (results below half the smallest subnormal round to 0) and up to the
  // largest float result.
  const std::vector<float> x = sweep(-103.9, 88.72, 2'000'000);
  check(
      "exp", x, run(vecmath::exp, x, isa), [](double v) { return std::exp(v); }, nullptr, 1.5, isa);
}

TEST_P(VecMathTest, ExpSaturatesLikeExpf_EdgeCases) {
  const Isa isa = GetParam();
  const std::vector<float> x = {-kInf,  -1e30f, -200.0f, -104.0f, -103.0f, -87.0f, 0.0f, -0.0f,
                                1e-45f, 88.72f, 88.73f,  89.0f,   100.0f,  1e30f,  kInf, kNaN};
  const std::vector<float> y = run(vecmath::exp, x, isa);
  for (size_t i = 0; i < x.size(); ++i) {
    const float expected = std::exp(x[i]);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(y[i])) << "exp(" << x[i] << ") = " << y[i] << ", expected NaN";
    } else if (expected == 0 || std::isinf(expected) || expected == 1) {
      EXPECT_EQ(y[i], expected) << "exp(" << x[i] << ") on " << simd::isa_name(isa);
    } else {
      EXPECT_NEAR(y[i], expected, ulp(expected)) << "exp(" << x[i] << ")";
    }
  }
}

TEST_P(VecMathTest, ExpShiftedSumsAndZeroesMaskedEntries_EveryTail) {
  const Isa isa = GetParam();
  // Lengths around every lane count (4, 8, 16) and the float partial-sum block.
  for (int64_t n : {1, 3, 4, 5, 8, 15, 16, 17, 33, 130, 511, 513, 2000}) {
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * 9.0f;
    if (n > 4) x[n - 2] = x[1] = -kInf;  // masked, as causal attention masks its scores
    const float shift = 7.5f;
    std::vector<float> y(x);  // in place, as attention calls it
    const double total = vecmath::exp_shifted(y.data(), shift, y.data(), n, isa);
    double expected_total = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double e = std::exp(static_cast<double>(x[i] - shift));
      expected_total += e;
      if (std::isinf(x[i])) {
        EXPECT_EQ(y[i], 0.0f) << "n " << n << " index " << i;
      } else {
        EXPECT_NEAR(y[i], e, ulp(e)) << "n " << n << " index " << i;
      }
    }
    EXPECT_NEAR(total, expected_total, 1e-6 * expected_total) << "n " << n;
  }
}

TEST_P(VecMathTest, GeluMatchesErfcReference_Sweep) {
  const Isa isa = GetParam();
  const std::vector<float> x = sweep(-14.0, 14.0, 1'000'000);
  check("gelu", x, run(vecmath::gelu, x, isa), gelu_ref, nullptr, 8.0, isa);
  check(
      "gelu_backward", x, run(vecmath::gelu_backward, x, isa),
      [](double v) { return gelu_cdf(v) + gelu_xpdf(v); },
      [](double v) { return std::max(gelu_cdf(v), std::fabs(gelu_xpdf(v))); }, 8.0, isa);
}

TEST_P(VecMathTest, GeluTanhMatchesReference_Sweep) {
  const Isa isa = GetParam();
  // The rounding of 2u = 2 sqrt(2/pi) (x + 0.044715 x^3) (a few ulp of 2u) moves the result by
  // 2u times as many ulp: about 40 ulp at |x| = 5 (2u = 16), 200 at |x| = 10 (2u = 86).
  for (double range : {5.0, 12.0}) {
    const std::vector<float> x = sweep(-range, range, 1'000'000);
    const double bound = range == 5.0 ? 64.0 : 320.0;
    check(
        range == 5.0 ? "gelu_tanh |x|<=5" : "gelu_tanh |x|<=12", x, run(vecmath::gelu_tanh, x, isa),
        [](double v) { return v * sigmoid_ref(tanh_v(v)); }, nullptr, bound, isa);
    auto terms = [](double v) {
      const double s = sigmoid_ref(tanh_v(v));
      return std::pair{s, v * s * sigmoid_ref(-tanh_v(v)) * tanh_dv(v)};
    };
    check(
        range == 5.0 ? "gelu_tanh_bwd |x|<=5" : "gelu_tanh_bwd |x|<=12", x,
        run(vecmath::gelu_tanh_backward, x, isa),
        [&](double v) {
          const auto [a, b] = terms(v);
          return a + b;
        },
        [&](double v) {
          const auto [a, b] = terms(v);
          return std::max(std::fabs(a), std::fabs(b));
        },
        bound, isa);
  }
}

TEST_P(VecMathTest, SiluMatchesReference_Sweep) {
  const Isa isa = GetParam();
  const std::vector<float> x = sweep(-100.0, 100.0, 1'000'000);
  check(
      "silu", x, run(vecmath::silu, x, isa), [](double v) { return v * sigmoid_ref(v); }, nullptr,
      6.0, isa);
  check(
      "silu_backward", x, run(vecmath::silu_backward, x, isa),
      [](double v) { return sigmoid_ref(v) * (1 + v * sigmoid_ref(-v)); },
      [](double v) {
        return std::max(sigmoid_ref(v), std::fabs(sigmoid_ref(v) * v * sigmoid_ref(-v)));
      },
      6.0, isa);
}

TEST_P(VecMathTest, ActivationsFollowTheFormulas_EdgeCases) {
  const Isa isa = GetParam();
  const std::vector<float> x = {0.0f, -0.0f, 1e-45f, -1e-45f, 1e30f, -1e30f, kInf, -kInf, kNaN};
  const std::vector<float> gelu = run(vecmath::gelu, x, isa);
  const std::vector<float> dgelu = run(vecmath::gelu_backward, x, isa);
  const std::vector<float> tanh = run(vecmath::gelu_tanh, x, isa);
  const std::vector<float> silu = run(vecmath::silu, x, isa);
  const std::vector<float> dsilu = run(vecmath::silu_backward, x, isa);
  // x = 0 and subnormal: gelu = x / 2 (rounded), gelu' = 1/2.
  EXPECT_EQ(gelu[0], 0.0f);
  EXPECT_EQ(dgelu[0], 0.5f);
  EXPECT_EQ(silu[2], 0.0f);  // 1e-45 / 2 rounds to 0 (ties to even)
  EXPECT_EQ(dsilu[0], 0.5f);
  // Large finite x: the identity above, exactly 0 below.
  for (const auto* y : {&gelu, &tanh, &silu}) {
    EXPECT_EQ((*y)[4], 1e30f);
    EXPECT_EQ((*y)[5], 0.0f);
    EXPECT_EQ((*y)[6], kInf);
    EXPECT_TRUE(std::isnan((*y)[7])) << "-inf * 0 is NaN, as in PyTorch";
    EXPECT_TRUE(std::isnan((*y)[8]));
  }
  EXPECT_EQ(dgelu[4], 1.0f);
  EXPECT_EQ(dgelu[5], 0.0f);
  EXPECT_EQ(dsilu[4], 1.0f);
  EXPECT_EQ(dsilu[5], 0.0f);
  EXPECT_TRUE(std::isnan(dgelu[8]));
  EXPECT_TRUE(std::isnan(dsilu[8]));
}

TEST_P(VecMathTest, BackwardScalesByGradient_EveryTail) {
  const Isa isa = GetParam();
  for (int64_t n : {1, 2, 3, 5, 7, 9, 17, 31, 100}) {
    std::vector<float> x(n), g(n), ones(n, 1.0f), d(n), gx(n);
    for (int64_t i = 0; i < n; ++i) {
      x[i] = std::cos(1.3f * static_cast<float>(i)) * 4.0f;
      g[i] = 0.25f * static_cast<float>(i % 7) - 0.6f;
    }
    for (Backward f :
         {vecmath::gelu_backward, vecmath::gelu_tanh_backward, vecmath::silu_backward}) {
      f(ones.data(), x.data(), d.data(), n, isa);
      f(g.data(), x.data(), gx.data(), n, isa);
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_NEAR(gx[i], g[i] * d[i], 2 * ulp(g[i] * d[i])) << "n " << n << " index " << i;
      }
    }
  }
}

// ---- row kernels ----

// Lengths around every lane count (4, 8, 16) and the float partial-sum block (32 vectors).
const std::vector<int64_t> kRowLengths = {1, 3, 4, 5, 8, 15, 16, 17, 33, 128, 130, 511, 513, 2000};

// A row of n values with a structure that no lane count hides (and an offset, so that the mean
// matters).
std::vector<float> test_row(int64_t n, float phase) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = 3.0f + std::sin(phase * static_cast<float>(i + 1)) * 2.0f;
  return x;
}

TEST_P(VecMathTest, RowMaxScaleAndSoftmaxBackwardGiveTheScalarLoopsBits_EveryTail) {
  const Isa isa = GetParam();
  for (int64_t n : kRowLengths) {
    std::vector<float> x = test_row(n, 0.73f), dp = test_row(n, 1.91f);
    x[static_cast<size_t>(n / 2)] = 9.5f;  // the largest, wherever the lanes split the row
    if (n > 4) x[1] = -kInf;               // masked, as causal attention masks its scores
    float expected_max = -kInf;
    for (float v : x) expected_max = std::max(expected_max, v);
    EXPECT_EQ(vecmath::max(x.data(), n, isa), expected_max) << "n " << n;

    std::vector<float> y(x);  // in place, as attention calls it
    vecmath::scale(y.data(), 0.37f, y.data(), n, isa);
    const float delta = 0.61f;
    std::vector<float> ds(static_cast<size_t>(n));
    vecmath::softmax_backward(x.data(), dp.data(), delta, ds.data(), n, isa);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(y[i], x[i] * 0.37f) << "scale: n " << n << " index " << i;
      EXPECT_EQ(ds[i], x[i] * (dp[i] - delta)) << "softmax_backward: n " << n << " index " << i;
    }
  }
  EXPECT_EQ(vecmath::max(nullptr, 0, isa), -kInf);
}

TEST_P(VecMathTest, DotMatchesDoubleReference_EveryTail) {
  const Isa isa = GetParam();
  for (int64_t n : kRowLengths) {
    const std::vector<float> a = test_row(n, 0.73f), b = test_row(n, 1.91f);
    double expected = 0, magnitude = 0;
    for (int64_t i = 0; i < n; ++i) {
      expected += static_cast<double>(a[i]) * b[i];
      magnitude += std::fabs(static_cast<double>(a[i]) * b[i]);
    }
    // Float sums of at most 32 terms per lane before double: a few ulp of the terms' total.
    EXPECT_NEAR(vecmath::dot(a.data(), b.data(), n, isa), expected, 32 * ulp(magnitude))
        << "n " << n;
  }
  EXPECT_EQ(vecmath::dot(nullptr, nullptr, 0, isa), 0.0);
}

TEST_P(VecMathTest, LayerNormRowMatchesDoubleReference_EveryTail) {
  const Isa isa = GetParam();
  const float eps = 1e-5f;
  for (int64_t n : kRowLengths) {
    const std::vector<float> x = test_row(n, 0.73f), w = test_row(n, 0.29f), b = test_row(n, 1.37f),
                             g = test_row(n, 2.11f);
    double mean = 0, var = 0;
    for (float v : x) mean += v;
    mean /= static_cast<double>(n);
    for (float v : x) var += (v - mean) * (v - mean);
    var /= static_cast<double>(n);
    const double rstd = 1 / std::sqrt(var + eps);
    std::vector<double> h(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) h[i] = (x[i] - mean) * rstd;
    // With and without the affine parameters.
    for (bool affine : {true, false}) {
      std::vector<double> gh(static_cast<size_t>(n));
      double mean_gh = 0, mean_ghh = 0, gx_scale = 0;
      for (int64_t i = 0; i < n; ++i) {
        gh[i] = affine ? static_cast<double>(g[i]) * w[i] : g[i];
        mean_gh += gh[i] / static_cast<double>(n);
        mean_ghh += gh[i] * h[i] / static_cast<double>(n);
        gx_scale = std::max(gx_scale, std::fabs(gh[i]) * rstd);  // the size of gx's terms
      }
      std::vector<float> xhat(static_cast<size_t>(n)), y(static_cast<size_t>(n)),
          gx(static_cast<size_t>(n));
      const float got_rstd =
          vecmath::layer_norm(x.data(), affine ? w.data() : nullptr, affine ? b.data() : nullptr,
                              eps, xhat.data(), y.data(), n, isa);
      EXPECT_NEAR(got_rstd, rstd, 4 * ulp(rstd)) << "n " << n;
      vecmath::layer_norm_backward(g.data(), xhat.data(), affine ? w.data() : nullptr, got_rstd,
                                   gx.data(), n, isa);
      for (int64_t i = 0; i < n; ++i) {
        const double expected_y = affine ? h[i] * w[i] + b[i] : h[i];
        const double expected_gx = rstd * (gh[i] - mean_gh - h[i] * mean_ghh);
        const char* what = affine ? " (affine)" : "";
        EXPECT_NEAR(xhat[i], h[i], 8 * ulp(1.0)) << "xhat: n " << n << " index " << i << what;
        EXPECT_NEAR(y[i], expected_y, 8 * ulp(std::max(1.0, std::fabs(expected_y))))
            << "y: n " << n << " index " << i << what;
        EXPECT_NEAR(gx[i], expected_gx, 16 * ulp(gx_scale))
            << "gx: n " << n << " index " << i << what;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, VecMathTest,
                         ::testing::Values(Isa::kAvx512, Isa::kAvx2, Isa::kBaseline),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(simd::isa_name(info.param));
                         });

}  // namespace
}  // namespace hsgd::kernels
