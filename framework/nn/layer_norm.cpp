#include "framework/nn/layer_norm.h"

#include <utility>

#include "comm/error.h"
#include "framework/tensor/nn_ops.h"

namespace hsgd::nn {

LayerNorm::LayerNorm(std::vector<int64_t> normalized_shape, LayerNormOptions options)
    : Module("LayerNorm"), normalized_shape_(std::move(normalized_shape)), options_(options) {
  HSGD_CHECK(!normalized_shape_.empty(), "LayerNorm: normalized_shape must not be empty");
  for (int64_t s : normalized_shape_) {
    HSGD_CHECK(s > 0, "LayerNorm: normalized_shape ", shape_str(normalized_shape_), " has size ", s,
               ", expected every size >= 1");
  }
  HSGD_CHECK(options_.eps >= 0, "LayerNorm: eps ", options_.eps, " must be >= 0");
  if (options_.elementwise_affine) {
    weight_ = register_parameter("weight", ones(normalized_shape_));
    bias_ = register_parameter("bias", zeros(normalized_shape_));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  HSGD_CHECK(x.defined(), "LayerNorm: the input is undefined");
  const size_t nd = normalized_shape_.size();
  const Shape& xs = x.shape();
  HSGD_CHECK(
      xs.size() >= nd && Shape(xs.end() - static_cast<int64_t>(nd), xs.end()) == normalized_shape_,
      "LayerNorm: input shape ", shape_str(xs), " does not end with normalized_shape ",
      shape_str(normalized_shape_));
  return layer_norm(x, normalized_shape_, weight_, bias_, options_.eps);
}

}  // namespace hsgd::nn
