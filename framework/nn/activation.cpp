#include "framework/nn/activation.h"

#include <utility>

#include "comm/error.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"

namespace hsgd::nn {

Tensor ReLU::forward(const Tensor& x) { return relu(x); }

GELU::GELU(GELUOptions options) : Module("GELU"), approximate_(std::move(options.approximate)) {
  HSGD_CHECK(approximate_ == "none" || approximate_ == "tanh", "GELU: approximate is '",
             approximate_, "', expected 'none' or 'tanh'");
}

Tensor GELU::forward(const Tensor& x) { return gelu(x, approximate_); }

Tensor SiLU::forward(const Tensor& x) { return silu(x); }

Tensor Flatten::forward(const Tensor& x) { return x.flatten(start_dim_, end_dim_); }

}  // namespace hsgd::nn
