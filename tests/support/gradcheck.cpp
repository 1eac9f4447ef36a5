#include "tests/support/gradcheck.h"

#include <gtest/gtest.h>

#include <cmath>

#include "framework/tensor/ops.h"

namespace hsgd::testing {

namespace {

// sum(y * w) in double.
double weighted_sum(const Tensor& y, const std::vector<float>& w) {
  const std::vector<float> v = y.to_vector();
  double total = 0;
  for (size_t i = 0; i < v.size(); ++i) total += static_cast<double>(v[i]) * w[i];
  return total;
}

}  // namespace

bool expect_gradients_match(const GradcheckFn& f, const std::vector<Tensor>& inputs,
                            const GradcheckOptions& options) {
  // Private contiguous leaves, so the check never touches the caller's tensors.
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) {
    if (!t.defined()) {
      leaves.push_back(t);
      continue;
    }
    Tensor leaf = t.detach().clone();
    leaf.set_requires_grad(t.requires_grad());
    leaves.push_back(leaf);
  }

  // Autograd gradients of L = sum(f(x) * W).
  Tensor y = f(leaves);
  Generator gen(options.seed);
  const Tensor w = uniform(y.shape(), 0.5f, 1.5f, gen);
  const std::vector<float> wv = w.to_vector();
  Tensor loss = sum(mul(y, w));
  loss.backward();

  bool ok = true;
  NoGradGuard no_grad;
  for (size_t idx = 0; idx < leaves.size(); ++idx) {
    Tensor& x = leaves[idx];
    if (!x.defined() || !x.requires_grad()) continue;
    if (!x.grad().defined()) {
      ADD_FAILURE() << "gradcheck: input " << idx << " (shape " << shape_str(x.shape())
                    << ") got no gradient from autograd";
      ok = false;
      continue;
    }
    const std::vector<float> analytic = x.grad().to_vector();
    float* p = x.data();
    int failures = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float saved = p[i];
      p[i] = static_cast<float>(saved + options.eps);
      const double plus = weighted_sum(f(leaves), wv);
      p[i] = static_cast<float>(saved - options.eps);
      const double minus = weighted_sum(f(leaves), wv);
      p[i] = saved;
      const double numeric = (plus - minus) / (2 * options.eps);
      const double actual = analytic[i];
      if (!(std::fabs(actual - numeric) <= options.atol + options.rtol * std::fabs(numeric))) {
        ok = false;
        if (++failures <= options.max_failures) {
          ADD_FAILURE() << "gradcheck: input " << idx << " (shape " << shape_str(x.shape())
                        << ") element " << i << ": numerical (expected) " << numeric
                        << ", autograd (actual) " << actual;
        }
      }
    }
    if (failures > options.max_failures) {
      ADD_FAILURE() << "gradcheck: input " << idx << ": " << failures << " of " << x.numel()
                    << " elements differ in total";
    }
  }
  return ok;
}

}  // namespace hsgd::testing
