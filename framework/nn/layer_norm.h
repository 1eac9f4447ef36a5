#pragma once
// nn::LayerNorm: normalises over the trailing dimensions, as torch.nn.LayerNorm(normalized_shape,
// eps, elementwise_affine).
//
// Each slice x[..., :] whose shape is normalized_shape is normalised with its own mean and biased
// variance: y = (x - mean) / sqrt(var + eps) * weight + bias. With elementwise_affine the module
// has parameters weight (= 1) and bias (= 0) of shape normalized_shape; without, it has none.
// Training and eval mode compute the same thing (no running statistics).
//
// Usage:
//   auto norm = std::make_shared<nn::LayerNorm>(std::vector<int64_t>{512});
//   Tensor y = norm->forward(x);      // x (..., 512)
//   nn::LayerNorm plain({4, 5}, {.eps = 1e-6, .elementwise_affine = false});
//
// Errors (InvalidArgument naming the values): an empty normalized_shape or a size < 1, eps < 0;
// forward when x's trailing dimensions are not normalized_shape.

#include <cstdint>
#include <vector>

#include "framework/nn/module.h"

namespace hsgd::nn {

struct LayerNormOptions {
  double eps = 1e-5;
  bool elementwise_affine = true;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::vector<int64_t> normalized_shape, LayerNormOptions options = {});

  // x (..., *normalized_shape) -> the same shape.
  Tensor forward(const Tensor& x) override;

  const std::vector<int64_t>& normalized_shape() const { return normalized_shape_; }
  const LayerNormOptions& options() const { return options_; }
  // Undefined without elementwise_affine.
  Tensor weight() const { return weight_; }
  Tensor bias() const { return bias_; }

 private:
  std::vector<int64_t> normalized_shape_;
  LayerNormOptions options_;
  Tensor weight_, bias_;  // normalized_shape, or undefined
};

}  // namespace hsgd::nn
