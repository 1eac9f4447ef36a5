#pragma once
// The layer tests' golden check (layers_golden_test, transformer_layers_test): a golden file
// holds the input "x" torch used, the output "out", an upstream gradient "gout" and the gradient
// "grad_x" of sum(out * gout).
//
// Usage:
//   golden::File f("linear");
//   nn::Linear fc(5, 4);
//   fc.load_state_dict({{"weight", f.tensor("w")}, {"bias", f.tensor("b")}});
//   check_forward_backward(fc, f, "linear");

#include <string>

#include "framework/nn/module.h"
#include "framework/tensor/ops.h"
#include "framework/tensor/tensor.h"
#include "tests/golden/golden.h"

namespace hsgd::testing {

// f's tensor key as a leaf that requires a gradient.
inline Tensor leaf(const golden::File& f, const std::string& key) { return f.leaf(key); }

// Runs out = module(x), backward of sum(out * gout), compares out and the gradient of x with the
// file's (naming what); returns x, whose grad() holds that gradient.
inline Tensor check_forward_backward(nn::Module& module, const golden::File& f,
                                     const std::string& what) {
  Tensor x = leaf(f, "x");
  Tensor out = module.forward(x);
  golden::expect_close(out, f.tensor("out"), what + " out");
  sum(mul(out, f.tensor("gout"))).backward();
  golden::expect_close(x.grad(), f.tensor("grad_x"), what + " grad_x");
  return x;
}

}  // namespace hsgd::testing
