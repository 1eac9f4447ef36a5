// Convergence smoke test of the tensor core and autograd alone: a 2-layer MLP trained by plain
// gradient descent on a synthetic, separable 3-class problem. Includes the umbrella header so
// that it is compiled by at least one test.

#include <gtest/gtest.h>

#include "hsgd.h"

namespace hsgd {
namespace {

TEST(ConvergenceTest, MlpLearnsSeparableClasses) {
  Generator gen(42);
  const int64_t n = 96, in = 4, hidden = 16, classes = 3;
  // Class c is centred at 3 * e_c in the first three features, plus unit noise.
  Tensor x = randn({n, in}, gen);
  std::vector<int64_t> y(n);
  for (int64_t i = 0; i < n; ++i) {
    y[i] = i % classes;
    x.data()[i * in + y[i]] += 3.0f;
  }
  Tensor w1 = uniform({hidden, in}, -0.5f, 0.5f, gen).set_requires_grad(true);
  Tensor b1 = zeros({hidden}).set_requires_grad(true);
  Tensor w2 = uniform({classes, hidden}, -0.5f, 0.5f, gen).set_requires_grad(true);
  Tensor b2 = zeros({classes}).set_requires_grad(true);
  const std::vector<Tensor> params = {w1, b1, w2, b2};

  auto forward = [&] { return linear(relu(linear(x, w1, b1)), w2, b2); };
  const float initial_loss = cross_entropy(forward(), y).item();
  float loss_value = initial_loss;
  for (int step = 0; step < 200; ++step) {
    for (const Tensor& p : params) {
      if (p.grad().defined()) p.grad().zero_();
    }
    Tensor loss = cross_entropy(forward(), y);
    loss.backward();
    loss_value = loss.item();
    NoGradGuard no_grad;
    for (Tensor p : params) p.add_(p.grad(), -0.2f);
  }
  EXPECT_LT(loss_value, 0.25f * initial_loss) << "initial loss " << initial_loss;

  NoGradGuard no_grad;
  const std::vector<float> predicted = argmax(forward(), 1).to_vector();
  int correct = 0;
  for (int64_t i = 0; i < n; ++i) correct += static_cast<int64_t>(predicted[i]) == y[i];
  EXPECT_GE(correct, 0.9 * n) << correct << " of " << n << " correct";
}

}  // namespace
}  // namespace hsgd
