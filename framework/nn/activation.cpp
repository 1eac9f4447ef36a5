#include "framework/nn/activation.h"

#include "framework/tensor/ops.h"

namespace hsgd::nn {

Tensor ReLU::forward(const Tensor& x) { return relu(x); }

Tensor Flatten::forward(const Tensor& x) { return x.flatten(start_dim_, end_dim_); }

}  // namespace hsgd::nn
