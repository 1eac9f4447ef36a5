#pragma once
// The one numerical-Jacobian checker every op's backward is tested with.
//
// expect_gradients_match(f, inputs) compares the autograd gradients of
//   L(inputs) = sum(f(inputs) * W)      (W: fixed random weights, so every output element counts)
// with central finite differences (L(x + eps) - L(x - eps)) / (2 eps), accumulated in double.
// Inputs with requires_grad() are checked; the others are held constant. f must be
// deterministic (an op that draws random numbers creates its Generator inside f).
// Pick inputs away from kinks (relu at 0, max-pool ties): finite differences across a kink fail.
// On failure it reports, per input, the element index, the numerical (expected) and the
// autograd (actual) value through ADD_FAILURE, and returns false.
//
// Usage:
//   Tensor a = randn({3, 5}, gen).set_requires_grad(true);
//   Tensor b = randn({5}, gen).set_requires_grad(true);
//   expect_gradients_match([](const std::vector<Tensor>& in) { return in[0] * in[1]; }, {a, b});

#include <cstdint>
#include <functional>
#include <vector>

#include "framework/tensor/tensor.h"

namespace hsgd::testing {

struct GradcheckOptions {
  double eps = 1e-2;   // finite-difference step (float32 needs 1e-2 .. 1e-3)
  double rtol = 1e-2;  // |autograd - numerical| <= atol + rtol * |numerical|
  double atol = 1e-3;
  uint64_t seed = 1234;  // for the output weights W
  int max_failures = 8;  // reported per input before giving up on it
};

using GradcheckFn = std::function<Tensor(const std::vector<Tensor>&)>;

bool expect_gradients_match(const GradcheckFn& f, const std::vector<Tensor>& inputs,
                            const GradcheckOptions& options = {});

}  // namespace hsgd::testing
