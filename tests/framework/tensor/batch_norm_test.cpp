// batch_norm: training and eval outputs and the running-statistics update against formulas
// computed here in double precision, gradients against a numerical Jacobian, errors.

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"
#include "tests/framework/tensor/grad_check.h"

namespace hsgd {
namespace {

// Per-channel mean and biased variance of x viewed as (N,C,S), in double.
struct ChannelStats {
  std::vector<double> mean, var;
};

ChannelStats channel_stats(const std::vector<float>& x, int64_t n, int64_t c, int64_t s) {
  ChannelStats st{std::vector<double>(c, 0.0), std::vector<double>(c, 0.0)};
  const double count = double(n * s);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t k = 0; k < s; ++k) st.mean[ch] += x[(i * c + ch) * s + k] / count;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t k = 0; k < s; ++k) {
        const double d = x[(i * c + ch) * s + k] - st.mean[ch];
        st.var[ch] += d * d / count;
      }
  return st;
}

// (x - mean) / sqrt(var + eps) * w + b per channel.
std::vector<float> normalise(const std::vector<float>& x, int64_t n, int64_t c, int64_t s,
                             const std::vector<double>& mean, const std::vector<double>& var,
                             const std::vector<float>& w, const std::vector<float>& b, double eps) {
  std::vector<float> y(x.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t k = 0; k < s; ++k) {
        const int64_t at = (i * c + ch) * s + k;
        y[at] = static_cast<float>((x[at] - mean[ch]) / std::sqrt(var[ch] + eps) * w[ch] + b[ch]);
      }
  return y;
}

TEST(BatchNormTest, Training_NormalisesWithBatchStatsAndUpdatesRunningStats) {
  Generator gen(21);
  for (double momentum : {0.1, 0.35}) {
    const int64_t n = 3, c = 4, h = 3, w = 5, s = h * w;
    Tensor x = add(mul(randn({n, c, h, w}, gen), 2.0f), 3.0f);  // mean far from 0
    Tensor weight = randn({c}, gen), bias = randn({c}, gen);
    Tensor rm = randn({c}, gen), rv = add(rand({c}, gen), 0.5f);
    const std::vector<float> rm0 = rm.to_vector(), rv0 = rv.to_vector();

    Tensor y = batch_norm(x, weight, bias, rm, rv, /*training=*/true, momentum, 1e-5);

    const ChannelStats st = channel_stats(x.to_vector(), n, c, s);
    testing::expect_near_all(y.to_vector(),
                             normalise(x.to_vector(), n, c, s, st.mean, st.var, weight.to_vector(),
                                       bias.to_vector(), 1e-5),
                             1e-5, "training output");
    std::vector<float> rm_expected(c), rv_expected(c);
    const double count = double(n * s);
    for (int64_t ch = 0; ch < c; ++ch) {
      rm_expected[ch] = float((1 - momentum) * rm0[ch] + momentum * st.mean[ch]);
      rv_expected[ch] =
          float((1 - momentum) * rv0[ch] + momentum * st.var[ch] * count / (count - 1));
    }
    testing::expect_near_all(rm.to_vector(), rm_expected, 1e-5, "running_mean");
    testing::expect_near_all(rv.to_vector(), rv_expected, 1e-5, "running_var (unbiased)");
  }
}

TEST(BatchNormTest, Eval_UsesRunningStatsAndLeavesThemUnchanged) {
  Generator gen(22);
  const int64_t n = 2, c = 3, s = 4;
  Tensor x = randn({n, c, 2, 2}, gen);
  Tensor weight = randn({c}, gen), bias = randn({c}, gen);
  Tensor rm = randn({c}, gen), rv = add(rand({c}, gen), 0.5f);
  const std::vector<float> rm0 = rm.to_vector(), rv0 = rv.to_vector();

  Tensor y = batch_norm(x, weight, bias, rm, rv, /*training=*/false, 0.1, 1e-3);

  const std::vector<double> mean(rm0.begin(), rm0.end()), var(rv0.begin(), rv0.end());
  testing::expect_near_all(
      y.to_vector(),
      normalise(x.to_vector(), n, c, s, mean, var, weight.to_vector(), bias.to_vector(), 1e-3),
      1e-5, "eval output");
  testing::expect_near_all(rm.to_vector(), rm0, 0, "running_mean after eval");
  testing::expect_near_all(rv.to_vector(), rv0, 0, "running_var after eval");
}

TEST(BatchNormTest, TwoDimInputWithoutAffine_NormalisesPerColumn) {
  Generator gen(23);
  Tensor x = randn({6, 3}, gen);
  Tensor y = batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), /*training=*/true);
  const ChannelStats st = channel_stats(x.to_vector(), 6, 3, 1);
  testing::expect_near_all(
      y.to_vector(), normalise(x.to_vector(), 6, 3, 1, st.mean, st.var, {1, 1, 1}, {0, 0, 0}, 1e-5),
      1e-5, "(N,C) input");
}

TEST(BatchNormTest, GradientsMatchNumericalJacobian_Training) {
  Generator gen(24);
  // (N,C,H,W) with batch 1 and odd sizes, (N,C) and (N,C,L).
  const std::vector<Shape> shapes = {{2, 3, 3, 2}, {1, 2, 3, 5}, {5, 3}, {3, 2, 5}};
  for (const Shape& shape : shapes) {
    const int64_t c = shape[1];
    testing::check_gradients("training " + shape_str(shape),
                             [](const std::vector<Tensor>& in) {
                               return batch_norm(in[0], in[1], in[2], Tensor(), Tensor(),
                                                 /*training=*/true);
                             },
                             {randn(shape, gen), randn({c}, gen), randn({c}, gen)});
  }
  testing::check_gradients("training without affine",
                           [](const std::vector<Tensor>& in) {
                             return batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(),
                                               /*training=*/true);
                           },
                           {randn({3, 2, 2, 3}, gen)});
}

TEST(BatchNormTest, GradientsMatchNumericalJacobian_Eval) {
  Generator gen(25);
  Tensor rm = randn({3}, gen), rv = add(rand({3}, gen), 0.5f);
  testing::check_gradients("eval",
                           [&](const std::vector<Tensor>& in) {
                             return batch_norm(in[0], in[1], in[2], rm, rv, /*training=*/false);
                           },
                           {randn({2, 3, 2, 3}, gen), randn({3}, gen), randn({3}, gen)});
}

// batch_norm_relu must be relu(batch_norm(...)) exactly: the same output, the same running
// statistics and the same three gradients, in training and eval, on planes large enough for the
// vector lanes and on a (N,C) input. The inputs put about half of the outputs below zero.
TEST(BatchNormTest, BatchNormRelu_EqualsReluOfBatchNormWithGradients) {
  Generator gen(26);
  struct Case {
    Shape shape;
    bool training;
  };
  for (const Case& cs : {Case{{4, 3, 7, 9}, true}, Case{{2, 5, 16, 16}, true}, Case{{6, 4}, true},
                         Case{{3, 2, 5, 5}, false}}) {
    const std::string what = shape_str(cs.shape) + (cs.training ? " training" : " eval");
    const int64_t c = cs.shape[1];
    const Tensor x0 = randn(cs.shape, gen), w0 = randn({c}, gen), b0 = randn({c}, gen);
    const Tensor gout = randn(cs.shape, gen);
    const Tensor rm0 = randn({c}, gen), rv0 = add(rand({c}, gen), 0.5f);
    struct Result {
      std::vector<float> y, gx, gw, gb, rm, rv;
    };
    auto run = [&](bool fused) {
      Tensor x = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
      Tensor b = b0.clone().set_requires_grad(true);
      Tensor rm = rm0.clone(), rv = rv0.clone();
      Tensor y = fused ? batch_norm_relu(x, w, b, rm, rv, cs.training)
                       : relu(batch_norm(x, w, b, rm, rv, cs.training));
      sum(y * gout).backward();
      return Result{y.to_vector(),        x.grad().to_vector(), w.grad().to_vector(),
                    b.grad().to_vector(), rm.to_vector(),       rv.to_vector()};
    };
    const Result fused = run(true), plain = run(false);
    int64_t zeros = 0;
    for (float v : plain.y) zeros += v == 0.0f;
    ASSERT_GT(zeros, 0) << what << ": the case must exercise ReLU's zeros";
    ASSERT_LT(zeros, static_cast<int64_t>(plain.y.size())) << what;
    testing::expect_near_all(fused.y, plain.y, 0, what + " y");
    testing::expect_near_all(fused.gx, plain.gx, 0, what + " grad x");
    testing::expect_near_all(fused.gw, plain.gw, 0, what + " grad weight");
    testing::expect_near_all(fused.gb, plain.gb, 0, what + " grad bias");
    testing::expect_near_all(fused.rm, plain.rm, 0, what + " running_mean");
    testing::expect_near_all(fused.rv, plain.rv, 0, what + " running_var");
  }
}

// batch_norm_add_relu must be relu(batch_norm(...) + residual) exactly: the same output, running
// statistics and four gradients (the residual's too), in training and eval, with and without the
// gradient of x.
TEST(BatchNormTest, BatchNormAddRelu_EqualsReluOfSumWithGradients) {
  Generator gen(27);
  struct Case {
    Shape shape;
    bool training, x_grad;
  };
  for (const Case& cs : {Case{{4, 3, 7, 9}, true, true}, Case{{2, 5, 16, 16}, true, true},
                         Case{{3, 2, 5, 5}, false, true}, Case{{2, 4, 6, 6}, true, false}}) {
    const std::string what = shape_str(cs.shape) + (cs.training ? " training" : " eval") +
                             (cs.x_grad ? "" : " without grad x");
    const int64_t c = cs.shape[1];
    const Tensor x0 = randn(cs.shape, gen), r0 = randn(cs.shape, gen);
    const Tensor w0 = randn({c}, gen), b0 = randn({c}, gen), gout = randn(cs.shape, gen);
    const Tensor rm0 = randn({c}, gen), rv0 = add(rand({c}, gen), 0.5f);
    struct Result {
      std::vector<float> y, gx, gr, gw, gb, rm, rv;
    };
    auto run = [&](bool fused) {
      Tensor x = x0.clone().set_requires_grad(cs.x_grad), r = r0.clone().set_requires_grad(true);
      Tensor w = w0.clone().set_requires_grad(true), b = b0.clone().set_requires_grad(true);
      Tensor rm = rm0.clone(), rv = rv0.clone();
      Tensor y = fused ? batch_norm_add_relu(x, r, w, b, rm, rv, cs.training)
                       : relu(add(batch_norm(x, w, b, rm, rv, cs.training), r));
      sum(y * gout).backward();
      return Result{y.to_vector(),        cs.x_grad ? x.grad().to_vector() : std::vector<float>{},
                    r.grad().to_vector(), w.grad().to_vector(),
                    b.grad().to_vector(), rm.to_vector(),
                    rv.to_vector()};
    };
    const Result fused = run(true), plain = run(false);
    int64_t zeros = 0;
    for (float v : plain.y) zeros += v == 0.0f;
    ASSERT_GT(zeros, 0) << what << ": the case must exercise ReLU's zeros";
    ASSERT_LT(zeros, static_cast<int64_t>(plain.y.size())) << what;
    testing::expect_near_all(fused.y, plain.y, 0, what + " y");
    testing::expect_near_all(fused.gx, plain.gx, 0, what + " grad x");
    testing::expect_near_all(fused.gr, plain.gr, 0, what + " grad residual");
    testing::expect_near_all(fused.gw, plain.gw, 0, what + " grad weight");
    testing::expect_near_all(fused.gb, plain.gb, 0, what + " grad bias");
    testing::expect_near_all(fused.rm, plain.rm, 0, what + " running_mean");
    testing::expect_near_all(fused.rv, plain.rv, 0, what + " running_var");
  }
  Generator bad(28);
  testing::expect_invalid_argument(
      [&] {
        batch_norm_add_relu(randn({2, 3, 4, 4}, bad), randn({2, 3, 4, 5}, bad), ones({3}),
                            zeros({3}), zeros({3}), ones({3}), true);
      },
      "[2, 3, 4, 5]");
}

TEST(BatchNormTest, BadInput_ThrowsInvalidArgumentNamingValues) {
  Generator gen(26);
  Tensor x = randn({2, 3, 4, 4}, gen);
  Tensor w = ones({3}), b = zeros({3}), rm = zeros({3}), rv = ones({3});
  testing::expect_invalid_argument([&] { batch_norm(x, ones({4}), b, rm, rv, true); }, "[4]");
  testing::expect_invalid_argument([&] { batch_norm(x, w, b, zeros({2}), rv, true); },
                                   "running_mean");
  testing::expect_invalid_argument(
      [&] { batch_norm(randn({5}, gen), Tensor(), Tensor(), Tensor(), Tensor(), true); }, "[5]");
  testing::expect_invalid_argument(
      [&] { batch_norm(x, w, b, Tensor(), Tensor(), /*training=*/false); }, "eval");
  testing::expect_invalid_argument(
      [&] {
        batch_norm(randn({1, 3}, gen), w, b, rm, rv, /*training=*/true);
      },
      "more than one value per channel");
}

}  // namespace
}  // namespace hsgd
