#pragma once
// Helpers of the tensor-op and kernel tests: element-wise comparison with index/expected/actual in
// the failure, an InvalidArgument expectation that checks the message names the value, and param (a
// random input that requires grad) and check_gradients, a thin adapter over the shared
// numerical-Jacobian checker (tests/support/gradcheck.h) that marks every input as requiring grad
// and labels failures.

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/tensor/tensor.h"
#include "tests/support/gradcheck.h"

namespace hsgd::testing {

// |actual[i] - expected[i]| <= tol * max(1, |expected[i]|) for every i.
inline void expect_near_all(const std::vector<float>& actual, const std::vector<float>& expected,
                            double tol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < actual.size() && failures < 5; ++i) {
    const double bound = tol * std::max(1.0, std::fabs(double(expected[i])));
    const bool same_nan = std::isnan(actual[i]) && std::isnan(expected[i]);
    if (!same_nan && !(std::fabs(double(actual[i]) - expected[i]) <= bound)) {
      ADD_FAILURE() << what << ": index " << i << " expected " << expected[i] << " actual "
                    << actual[i];
      ++failures;
    }
  }
}

// fn must throw hsgd::InvalidArgument whose message contains `names`.
template <typename Fn>
void expect_invalid_argument(Fn&& fn, const std::string& names) {
  try {
    fn();
    ADD_FAILURE() << "expected hsgd::InvalidArgument mentioning '" << names << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(names), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << names << "'";
  }
}

// A randn leaf that requires grad: an input of a gradient check.
inline Tensor param(Shape shape, Generator& gen) {
  return randn(std::move(shape), gen).set_requires_grad(true);
}

// Checks the autograd gradients of fn with respect to every input against a numerical Jacobian.
inline void check_gradients(const std::string& what, const GradcheckFn& fn,
                            std::vector<Tensor> inputs) {
  SCOPED_TRACE(what);
  for (Tensor& t : inputs) t.set_requires_grad(true);
  EXPECT_TRUE(expect_gradients_match(fn, inputs)) << what;
}

}  // namespace hsgd::testing
