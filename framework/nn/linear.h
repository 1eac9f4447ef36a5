#pragma once
// nn::Linear: y = x W^T + b, with W (out_features, in_features) and b (out_features).
//
// Initialisation is PyTorch's default: W and b from U(-1/sqrt(in), 1/sqrt(in)), drawn from the
// given Generator (or from the default generator, see manual_seed in framework/tensor/generator.h).
//
// Usage:
//   hsgd::Generator gen(0);
//   auto fc = std::make_shared<nn::Linear>(784, 10, /*bias=*/true, gen);
//   Tensor y = fc->forward(x);        // x (N,784) -> y (N,10); any leading dims are kept
//
// forward throws InvalidArgument naming both sizes when x's last dimension is not in_features.

#include <cstdint>

#include "framework/nn/module.h"

namespace hsgd::nn {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Linear(int64_t in_features, int64_t out_features, bool bias, Generator& gen);

  // x (..., in_features) -> (..., out_features)
  Tensor forward(const Tensor& x) override;

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  Tensor weight() const { return weight_; }
  // Undefined when built with bias = false.
  Tensor bias() const { return bias_; }

 private:
  void reset_parameters(bool bias, Generator& gen);

  int64_t in_features_;
  int64_t out_features_;
  Tensor weight_;  // (out, in)
  Tensor bias_;    // (out) or undefined
};

}  // namespace hsgd::nn
