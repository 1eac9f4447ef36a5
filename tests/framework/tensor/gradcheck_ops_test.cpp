// Every differentiable op's backward against the numerical Jacobian (tests/support/gradcheck.h),
// over several shapes including batch 1, odd sizes and broadcasting.

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "framework/autograd/node.h"
#include "framework/tensor/ops.h"
#include "tests/framework/tensor/grad_check.h"

namespace hsgd {
namespace {

using testing::expect_gradients_match;
using testing::param;
using In = const std::vector<Tensor>&;

// Values in [lo, hi): keeps log/sqrt/div away from 0 and relu away from its kink.
Tensor param_in(Shape shape, float lo, float hi, Generator& gen) {
  return uniform(std::move(shape), lo, hi, gen).set_requires_grad(true);
}

struct BinaryCase {
  Shape a, b;
};

const std::vector<BinaryCase> kBroadcastCases = {
    {{1}, {1}},       {{5}, {5}},
    {{3, 4}, {3, 4}}, {{3, 4}, {4}},
    {{3, 4}, {3, 1}}, {{1, 4}, {3, 1}},
    {{2, 3, 5}, {5}}, {{2, 1, 5}, {3, 1}},
    {{1, 7}, {1, 7}}, {{2, 3, 5}, {2, 3, 5}},
    {{}, {3, 2}},
};

TEST(GradcheckTest, AddSubMulDivBroadcast) {
  Generator gen(10);
  for (const auto& c : kBroadcastCases) {
    SCOPED_TRACE(shape_str(c.a) + " op " + shape_str(c.b));
    Tensor a = param(c.a, gen), b = param(c.b, gen);
    Tensor bpos = param_in(c.b, 0.5f, 2.0f, gen);
    EXPECT_TRUE(expect_gradients_match([](In x) { return x[0] + x[1]; }, {a, b}));
    EXPECT_TRUE(expect_gradients_match([](In x) { return x[0] - x[1]; }, {a, b}));
    EXPECT_TRUE(expect_gradients_match([](In x) { return x[0] * x[1]; }, {a, b}));
    EXPECT_TRUE(expect_gradients_match([](In x) { return x[0] / x[1]; }, {a, bpos}));
    EXPECT_TRUE(expect_gradients_match([](In x) { return add(x[0], x[1], -2.5f); }, {a, b}));
  }
}

TEST(GradcheckTest, OnlySomeInputsRequireGrad) {
  Generator gen(11);
  Tensor a = param({3, 4}, gen);
  Tensor b = randn({4}, gen);  // constant
  EXPECT_TRUE(expect_gradients_match([](In x) { return x[0] * x[1]; }, {a, b}));
  EXPECT_TRUE(expect_gradients_match([](In x) { return x[1] * x[0]; }, {a, b}));
}

TEST(GradcheckTest, ScalarOperators) {
  Generator gen(12);
  for (Shape s : {Shape{1}, Shape{3}, Shape{2, 5}}) {
    Tensor a = param_in(s, 0.5f, 2.0f, gen);
    EXPECT_TRUE(expect_gradients_match([](In x) { return x[0] * 3.0f + 1.0f; }, {a}));
    EXPECT_TRUE(expect_gradients_match([](In x) { return 2.0f - x[0] / 4.0f; }, {a}));
    EXPECT_TRUE(expect_gradients_match([](In x) { return 2.0f / x[0]; }, {a}));
    EXPECT_TRUE(expect_gradients_match([](In x) { return -x[0]; }, {a}));
  }
}

TEST(GradcheckTest, UnaryOps) {
  Generator gen(13);
  for (Shape s : {Shape{1}, Shape{7}, Shape{3, 5}, Shape{2, 3, 3}}) {
    SCOPED_TRACE(shape_str(s));
    Tensor any = param(s, gen);
    Tensor pos = param_in(s, 0.5f, 3.0f, gen);
    // relu: |x| >= 0.1 keeps finite differences off the kink.
    Tensor away = uniform(s, 0.1f, 1.0f, gen) * (uniform(s, 0.0f, 1.0f, gen) - 0.5f) /
                  abs(uniform(s, 0.0f, 1.0f, gen) - 0.5f);
    away = away.detach().set_requires_grad(true);
    EXPECT_TRUE(expect_gradients_match([](In x) { return relu(x[0]); }, {away}));
    EXPECT_TRUE(expect_gradients_match([](In x) { return abs(x[0]); }, {away}));
    EXPECT_TRUE(expect_gradients_match([](In x) { return exp(x[0]); }, {any}));
    EXPECT_TRUE(expect_gradients_match([](In x) { return tanh(x[0]); }, {any}));
    EXPECT_TRUE(expect_gradients_match([](In x) { return sigmoid(x[0]); }, {any}));
    EXPECT_TRUE(expect_gradients_match([](In x) { return log(x[0]); }, {pos}));
    EXPECT_TRUE(expect_gradients_match([](In x) { return sqrt(x[0]); }, {pos}));
    EXPECT_TRUE(expect_gradients_match([](In x) { return pow(x[0], 3.0f); }, {pos}));
    EXPECT_TRUE(expect_gradients_match([](In x) { return pow(x[0], -1.5f); }, {pos}));
  }
}

TEST(GradcheckTest, Matmul) {
  Generator gen(14);
  for (auto [m, k, n] : {std::tuple{1, 1, 1}, {1, 5, 3}, {4, 3, 1}, {5, 7, 3}}) {
    SCOPED_TRACE(::testing::Message() << m << "x" << k << "x" << n);
    Tensor a = param({m, k}, gen), b = param({k, n}, gen);
    EXPECT_TRUE(expect_gradients_match([](In x) { return matmul(x[0], x[1]); }, {a, b}));
    // Transposed views as operands.
    EXPECT_TRUE(expect_gradients_match([](In x) { return matmul(x[1].t(), x[0].t()); }, {a, b}));
  }
  Tensor a3 = param({2, 3, 4}, gen), b3 = param({2, 4, 5}, gen), w = param({4, 2}, gen);
  EXPECT_TRUE(expect_gradients_match([](In x) { return matmul(x[0], x[1]); }, {a3, b3}));
  EXPECT_TRUE(expect_gradients_match([](In x) { return matmul(x[0], x[1]); }, {a3, w}));
  Tensor v = param({4}, gen);
  EXPECT_TRUE(expect_gradients_match([](In x) { return matmul(x[0], x[1]); }, {v, w}));
  EXPECT_TRUE(expect_gradients_match([](In x) { return matmul(x[1].t(), x[0]); }, {v, w}));
}

TEST(GradcheckTest, Linear) {
  Generator gen(15);
  for (auto [n, in, out] : {std::tuple{1, 1, 1}, {1, 4, 3}, {5, 3, 2}, {7, 6, 5}}) {
    SCOPED_TRACE(::testing::Message() << n << "," << in << "->" << out);
    Tensor x = param({n, in}, gen), w = param({out, in}, gen), b = param({out}, gen);
    EXPECT_TRUE(expect_gradients_match([](In a) { return linear(a[0], a[1], a[2]); }, {x, w, b}));
    EXPECT_TRUE(expect_gradients_match([](In a) { return linear(a[0], a[1]); }, {x, w}));
  }
  Tensor x3 = param({2, 3, 4}, gen), w = param({5, 4}, gen), b = param({5}, gen);
  EXPECT_TRUE(expect_gradients_match([](In a) { return linear(a[0], a[1], a[2]); }, {x3, w, b}));
}

TEST(GradcheckTest, Reductions) {
  Generator gen(16);
  for (Shape s : {Shape{1}, Shape{5}, Shape{3, 4}, Shape{2, 3, 5}, Shape{1, 1, 3}}) {
    SCOPED_TRACE(shape_str(s));
    Tensor x = param(s, gen);
    EXPECT_TRUE(expect_gradients_match([](In a) { return sum(a[0]); }, {x}));
    EXPECT_TRUE(expect_gradients_match([](In a) { return mean(a[0]); }, {x}));
    for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
      EXPECT_TRUE(expect_gradients_match([d](In a) { return sum(a[0], d); }, {x}));
      EXPECT_TRUE(expect_gradients_match([d](In a) { return sum(a[0], d, true); }, {x}));
      EXPECT_TRUE(expect_gradients_match([d](In a) { return mean(a[0], -1 - d); }, {x}));
    }
  }
}

TEST(GradcheckTest, LogSoftmaxAndLosses) {
  Generator gen(17);
  for (auto [n, c] : {std::pair{1, 1}, {1, 4}, {3, 5}, {7, 10}}) {
    SCOPED_TRACE(::testing::Message() << n << "x" << c);
    Tensor x = param({n, c}, gen);
    std::vector<int64_t> targets;
    for (int64_t i = 0; i < n; ++i) targets.push_back(static_cast<int64_t>(gen.next_below(c)));
    EXPECT_TRUE(expect_gradients_match([](In a) { return log_softmax(a[0], 1); }, {x}));
    EXPECT_TRUE(expect_gradients_match([](In a) { return log_softmax(a[0], 0); }, {x}));
    EXPECT_TRUE(expect_gradients_match([](In a) { return softmax(a[0], 1); }, {x}));
    EXPECT_TRUE(expect_gradients_match([&](In a) { return cross_entropy(a[0], targets); }, {x}));
    EXPECT_TRUE(expect_gradients_match([&](In a) { return nll_loss(a[0] * 0.5f, targets); }, {x}));
    Tensor y = param({n, c}, gen);
    EXPECT_TRUE(expect_gradients_match([](In a) { return mse_loss(a[0], a[1]); }, {x, y}));
  }
  Tensor x3 = param({2, 3, 4}, gen);
  EXPECT_TRUE(expect_gradients_match([](In a) { return log_softmax(a[0], 1); }, {x3}));
}

TEST(GradcheckTest, ViewsAndCat) {
  Generator gen(18);
  Tensor x = param({2, 3, 4}, gen);
  EXPECT_TRUE(expect_gradients_match(
      [](In a) {
        return a[0].reshape({4, 6}) * a[0].reshape({4, 6});
      },
      {x}));
  EXPECT_TRUE(expect_gradients_match([](In a) { return a[0].flatten(1); }, {x}));
  EXPECT_TRUE(expect_gradients_match([](In a) { return a[0].transpose(0, 2).reshape({-1}); }, {x}));
  EXPECT_TRUE(expect_gradients_match(
      [](In a) {
        return a[0].permute({1, 2, 0}).contiguous();
      },
      {x}));
  EXPECT_TRUE(expect_gradients_match([](In a) { return a[0].narrow(2, 1, 2) * 2.0f; }, {x}));
  EXPECT_TRUE(
      expect_gradients_match([](In a) { return a[0].unsqueeze(1).squeeze(1).clone(); }, {x}));
  Tensor y = param({2, 1, 4}, gen);
  EXPECT_TRUE(expect_gradients_match([](In a) { return cat({a[0], a[1], a[0]}, 1); }, {x, y}));
}

TEST(GradcheckTest, SmallMlpEndToEnd) {
  Generator gen(19);
  Tensor x = randn({3, 5}, gen);
  Tensor w1 = param({4, 5}, gen), b1 = param({4}, gen), w2 = param({3, 4}, gen),
         b2 = param({3}, gen);
  const std::vector<int64_t> targets = {0, 2, 1};
  EXPECT_TRUE(expect_gradients_match(
      [&](In a) { return cross_entropy(linear(tanh(linear(x, a[0], a[1])), a[2], a[3]), targets); },
      {w1, b1, w2, b2}));
}

}  // namespace
}  // namespace hsgd

namespace hsgd {
namespace {

// The checker itself must catch a wrong backward.
TEST(GradcheckTest, DetectsWrongBackward) {
  auto wrong_square = [](const std::vector<Tensor>& in) {
    const Tensor& x = in[0];
    Tensor out = x.detach() * x.detach();
    if (autograd::needs_grad({x})) {
      autograd::record(out, "WrongSquareBackward", {x},
                       [x = x.detach()](const Tensor& g, const autograd::NeedsGrad&) {
                         return std::vector<Tensor>{g * x * 2.2f};  // should be 2
                       });
    }
    return out;
  };
  Generator gen(20);
  Tensor x = uniform({1}, 0.5f, 1.0f, gen).set_requires_grad(true);  // one element: one failure
  bool ok = true;
  EXPECT_NONFATAL_FAILURE(ok = testing::expect_gradients_match(wrong_square, {x}),
                          "element 0: numerical (expected)");
  EXPECT_FALSE(ok);
}

}  // namespace
}  // namespace hsgd
