// Forward values of the ops against naive reference loops written here, and error messages.

#include "framework/tensor/ops.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "comm/error.h"
#include "tests/support/error_message.h"

namespace hsgd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using testing::error_message;

void expect_near_all(const std::vector<float>& actual, const std::vector<double>& expected,
                     double tol) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], tol * (1 + std::fabs(expected[i]))) << "index " << i;
  }
}

// Naive (M,K) @ (K,N) on row-major vectors, in double.
std::vector<double> naive_matmul(const std::vector<float>& a, const std::vector<float>& b,
                                 int64_t m, int64_t k, int64_t n) {
  std::vector<double> out(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) out[i * n + j] += double(a[i * k + p]) * b[p * n + j];
  return out;
}

TEST(OpsTest, BroadcastingArithmetic) {
  Generator gen(1);
  Tensor a = randn({4, 1, 3}, gen);
  Tensor b = randn({5, 1}, gen);
  const std::vector<float> va = a.to_vector(), vb = b.to_vector();
  Tensor s = a + b, d = a - b, p = a * b, q = a / b;
  ASSERT_EQ(s.shape(), (Shape{4, 5, 3}));
  std::vector<double> es, ed, ep, eq;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; ++j)
      for (int k = 0; k < 3; ++k) {
        const double x = va[i * 3 + k], y = vb[j];
        es.push_back(x + y);
        ed.push_back(x - y);
        ep.push_back(x * y);
        eq.push_back(x / y);
      }
  expect_near_all(s.to_vector(), es, 1e-6);
  expect_near_all(d.to_vector(), ed, 1e-6);
  expect_near_all(p.to_vector(), ep, 1e-6);
  expect_near_all(q.to_vector(), eq, 1e-5);
}

TEST(OpsTest, ScalarOperatorsAndUnary) {
  Tensor x = from_vector({-2, -0.5, 0.25, 3});
  EXPECT_THAT((x + 1.0f).to_vector(), ElementsAre(-1, 0.5, 1.25, 4));
  EXPECT_THAT((1.0f - x).to_vector(), ElementsAre(3, 1.5, 0.75, -2));
  EXPECT_THAT((x * 2.0f).to_vector(), ElementsAre(-4, -1, 0.5, 6));
  EXPECT_THAT((x / 2.0f).to_vector(), ElementsAre(-1, -0.25, 0.125, 1.5));
  EXPECT_THAT((-x).to_vector(), ElementsAre(2, 0.5, -0.25, -3));
  EXPECT_THAT(relu(x).to_vector(), ElementsAre(0, 0, 0.25, 3));
  EXPECT_THAT(abs(x).to_vector(), ElementsAre(2, 0.5, 0.25, 3));
  std::vector<double> e_exp, e_tanh, e_sig;
  for (float v : x.to_vector()) {
    e_exp.push_back(std::exp(double(v)));
    e_tanh.push_back(std::tanh(double(v)));
    e_sig.push_back(1 / (1 + std::exp(-double(v))));
  }
  expect_near_all(exp(x).to_vector(), e_exp, 1e-6);
  expect_near_all(tanh(x).to_vector(), e_tanh, 1e-6);
  expect_near_all(sigmoid(x).to_vector(), e_sig, 1e-6);
  Tensor y = from_vector({0.25, 1, 4});
  expect_near_all(log(y).to_vector(), {std::log(0.25), 0, std::log(4.0)}, 1e-6);
  expect_near_all(sqrt(y).to_vector(), {0.5, 1, 2}, 1e-6);
  expect_near_all(pow(y, 1.5f).to_vector(), {0.125, 1, 8}, 1e-6);
}

TEST(OpsTest, ElementwiseOnNonContiguousInputs) {
  Tensor a = arange(6).reshape({2, 3});
  Tensor b = from_vector({10, 20, 30, 40, 50, 60}, {3, 2});
  // a (2,3) + b^T (2,3): b^T is a strided view.
  EXPECT_THAT((a + b.t()).to_vector(), ElementsAre(10, 31, 52, 23, 44, 65));
  EXPECT_THAT(relu(b.t() - 35.0f).to_vector(), ElementsAre(0, 0, 15, 0, 5, 25));
}

TEST(OpsTest, BroadcastMismatchNamesShapes) {
  const std::string msg = error_message([] { zeros({2, 3}) + zeros({4}); });
  EXPECT_THAT(msg, HasSubstr("[2, 3]"));
  EXPECT_THAT(msg, HasSubstr("[4]"));
}

TEST(OpsTest, MatmulMatchesNaive_AllTransposeLayouts) {
  Generator gen(2);
  for (auto [m, k, n] : {std::tuple{1, 1, 1}, {3, 5, 7}, {8, 1, 4}, {1, 9, 2}, {17, 13, 11}}) {
    Tensor a = randn({m, k}, gen), b = randn({k, n}, gen);
    const std::vector<double> expected = naive_matmul(a.to_vector(), b.to_vector(), m, k, n);
    SCOPED_TRACE(::testing::Message() << m << "x" << k << "x" << n);
    expect_near_all(matmul(a, b).to_vector(), expected, 1e-5);
    // The same product from transposed storage (passed to sgemm as a Trans flag).
    Tensor at = a.t().contiguous().t(), bt = b.t().contiguous().t();
    expect_near_all(matmul(at, b).to_vector(), expected, 1e-5);
    expect_near_all(matmul(a, bt).to_vector(), expected, 1e-5);
    expect_near_all(matmul(at, bt).to_vector(), expected, 1e-5);
  }
}

TEST(OpsTest, MatmulBatchedAndVectors) {
  Generator gen(3);
  Tensor a = randn({2, 3, 4}, gen), b = randn({2, 4, 5}, gen), w = randn({4, 5}, gen);
  Tensor ab = matmul(a, b), aw = matmul(a, w);
  ASSERT_EQ(ab.shape(), (Shape{2, 3, 5}));
  ASSERT_EQ(aw.shape(), (Shape{2, 3, 5}));
  for (int64_t i = 0; i < 2; ++i) {
    Tensor ai = a.narrow(0, i, 1).squeeze(0);
    expect_near_all(ab.narrow(0, i, 1).to_vector(),
                    naive_matmul(ai.to_vector(), b.narrow(0, i, 1).to_vector(), 3, 4, 5), 1e-5);
    expect_near_all(aw.narrow(0, i, 1).to_vector(),
                    naive_matmul(ai.to_vector(), w.to_vector(), 3, 4, 5), 1e-5);
  }
  Tensor v = randn({4}, gen);
  EXPECT_EQ(matmul(v, w).shape(), (Shape{5}));
  EXPECT_EQ(matmul(w.t(), v).shape(), (Shape{5}));
  expect_near_all(matmul(v, w).to_vector(), naive_matmul(v.to_vector(), w.to_vector(), 1, 4, 5),
                  1e-5);
}

TEST(OpsTest, MatmulInnerMismatchNamesDims) {
  const std::string msg = error_message([] { matmul(zeros({2, 3}), zeros({4, 5})); });
  EXPECT_THAT(msg, HasSubstr("[2, 3]"));
  EXPECT_THAT(msg, HasSubstr("[4, 5]"));
  EXPECT_THAT(msg, HasSubstr("3 vs 4"));
}

TEST(OpsTest, LinearMatchesMatmulPlusBias) {
  Generator gen(4);
  Tensor x = randn({5, 3}, gen), w = randn({4, 3}, gen), b = randn({4}, gen);
  std::vector<double> expected =
      naive_matmul(x.to_vector(), w.t().contiguous().to_vector(), 5, 3, 4);
  const std::vector<double> no_bias = expected;
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 4; ++j) expected[i * 4 + j] += b.to_vector()[j];
  expect_near_all(linear(x, w, b).to_vector(), expected, 1e-5);
  expect_near_all(linear(x, w).to_vector(), no_bias, 1e-5);
  EXPECT_THAT(error_message([&] { linear(zeros({5, 2}), w, b); }), HasSubstr("input features 2"));
  EXPECT_THROW(linear(x, w, zeros({3})), InvalidArgument);
}

TEST(OpsTest, SumMeanArgmax) {
  Tensor x = arange(24).reshape({2, 3, 4});
  EXPECT_EQ(sum(x).item(), 276.0f);
  EXPECT_EQ(mean(x).item(), 11.5f);
  Tensor s1 = sum(x, 1);
  ASSERT_EQ(s1.shape(), (Shape{2, 4}));
  // sum over j of (i*12 + j*4 + k) = 3*(i*12 + k) + 12
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 4; ++k) EXPECT_EQ(s1.to_vector()[i * 4 + k], 3 * (i * 12 + k) + 12);
  EXPECT_EQ(sum(x, -1, true).shape(), (Shape{2, 3, 1}));
  EXPECT_THAT(mean(x, 0).to_vector()[0], 6.0f);
  EXPECT_THAT(sum(x.transpose(0, 2), 0).to_vector(), sum(x, 2).t().contiguous().to_vector());
  Tensor y = from_vector({1, 5, 5, 2, 0, 3}, {2, 3});
  EXPECT_THAT(argmax(y, 1).to_vector(), ElementsAre(1, 2));
  EXPECT_THAT(argmax(y, 0).to_vector(), ElementsAre(1, 0, 0));
}

TEST(OpsTest, CatJoinsAlongDim) {
  Tensor a = arange(4).reshape({2, 2}), b = full({2, 1}, 9);
  EXPECT_THAT(cat({a, b}, 1).to_vector(), ElementsAre(0, 1, 9, 2, 3, 9));
  EXPECT_THAT(cat({a, a}, 0).to_vector(), ElementsAre(0, 1, 2, 3, 0, 1, 2, 3));
  EXPECT_THROW(cat({a, b}, 0), InvalidArgument);
}

TEST(OpsTest, LogSoftmaxMatchesNaive_StableForLargeLogits) {
  Tensor x = from_vector({1, 2, 3, 1000, 1001, 1002, -5, 0, 5}, {3, 3});
  const std::vector<float> v = x.to_vector();
  std::vector<double> expected;
  for (int i = 0; i < 3; ++i) {
    double m = std::max({double(v[i * 3]), double(v[i * 3 + 1]), double(v[i * 3 + 2])});
    double z = 0;
    for (int j = 0; j < 3; ++j) z += std::exp(v[i * 3 + j] - m);
    for (int j = 0; j < 3; ++j) expected.push_back(v[i * 3 + j] - m - std::log(z));
  }
  expect_near_all(log_softmax(x, 1).to_vector(), expected, 1e-6);
  // Along dim 0 equals along dim 1 of the transpose.
  expect_near_all(log_softmax(x.t(), 0).t().contiguous().to_vector(), expected, 1e-6);
  const std::vector<float> p = softmax(x, -1).to_vector();
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(p[i * 3] + p[i * 3 + 1] + p[i * 3 + 2], 1.0, 1e-6);
}

TEST(OpsTest, NllAndCrossEntropyMatchNaive) {
  Generator gen(5);
  Tensor logits = randn({4, 3}, gen);
  const std::vector<int64_t> targets = {2, 0, 1, 2};
  const std::vector<float> v = logits.to_vector();
  double expected = 0;
  for (int i = 0; i < 4; ++i) {
    double z = 0;
    for (int j = 0; j < 3; ++j) z += std::exp(double(v[i * 3 + j]));
    expected += -(v[i * 3 + targets[i]] - std::log(z));
  }
  expected /= 4;
  EXPECT_NEAR(cross_entropy(logits, targets).item(), expected, 1e-6);
  EXPECT_NEAR(nll_loss(log_softmax(logits, 1), targets).item(), expected, 1e-6);
}

TEST(OpsTest, NllLossTargetOutOfRangeNamesIndexValueAndClasses) {
  const std::string msg = error_message([] { nll_loss(zeros({3, 4}), {0, 4, 1}); });
  EXPECT_THAT(msg, HasSubstr("nll_loss: sample 1 of the batch of 3 has target 4"));
  EXPECT_THAT(msg, HasSubstr("[0, 4) (the input has 4 classes)"));
  EXPECT_THROW(nll_loss(zeros({3, 4}), {0, -1, 1}), InvalidArgument);
  EXPECT_THAT(error_message([] {
                nll_loss(zeros({3, 4}), {0, 1});
              }),
              HasSubstr("2 targets for a batch of 3"));
}

TEST(OpsTest, SumToReducesBroadcastDims) {
  Tensor g = ones({4, 2, 3});
  EXPECT_THAT(sum_to(g, {3}).to_vector(), ElementsAre(8, 8, 8));
  EXPECT_THAT(sum_to(g, {2, 1}).to_vector(), ElementsAre(12, 12));
  EXPECT_EQ(sum_to(g, {1, 1, 1}).item(), 24.0f);
  EXPECT_THROW(sum_to(g, {5}), InvalidArgument);
}

}  // namespace
}  // namespace hsgd

namespace hsgd {
namespace {

TEST(OpsTest, IndexTensorsRoundTrip_AndRejectNonIntegers) {
  const std::vector<int64_t> idx = {3, 0, 9, 1};
  EXPECT_EQ(to_indices(from_indices(idx)), idx);
  Tensor logits = zeros({4, 10});
  EXPECT_EQ(cross_entropy(logits, to_indices(from_indices(idx))).item(),
            cross_entropy(logits, idx).item());
  EXPECT_THAT(error_message([] {
                to_indices(from_vector({1, 2.5f}));
              }),
              HasSubstr("element 1 is 2.5"));
  EXPECT_THROW(to_indices(from_vector({-1})), InvalidArgument);
  EXPECT_THROW(from_indices({-3}), InvalidArgument);
}

}  // namespace
}  // namespace hsgd
