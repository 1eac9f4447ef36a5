#pragma once
// nn::Conv2d: 2-D cross-correlation as torch.nn.Conv2d (no groups or dilation).
//
// Weight (out_channels, in_channels, kh, kw) and bias (out_channels) are initialised as in
// PyTorch: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = in_channels * kh * kw.
//
// Usage:
//   auto conv = std::make_shared<nn::Conv2d>(nn::Conv2dOptions{
//       .in_channels = 3, .out_channels = 16, .kernel_size = {3, 3}, .padding = {1, 1}});
//   Tensor y = conv->forward(x);      // x (N,3,H,W) -> (N,16,H,W)

#include <cstdint>

#include "framework/nn/module.h"
#include "framework/tensor/nn_ops.h"

namespace hsgd::nn {

struct Conv2dOptions {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  Size2 kernel_size = {1, 1};  // (kh, kw)
  Size2 stride = {1, 1};
  Size2 padding = {0, 0};  // zeros on each side
  bool bias = true;
};

class Conv2d : public Module {
 public:
  explicit Conv2d(const Conv2dOptions& options);
  Conv2d(const Conv2dOptions& options, Generator& gen);

  // x (N,in_channels,H,W) -> (N,out_channels,OH,OW)
  Tensor forward(const Tensor& x) override;

  const Conv2dOptions& options() const { return options_; }
  Tensor weight() const { return weight_; }
  Tensor bias() const { return bias_; }  // undefined when options.bias is false

 private:
  void reset_parameters(Generator& gen);

  Conv2dOptions options_;
  Tensor weight_;  // (O,C,kh,kw)
  Tensor bias_;    // (O) or undefined
};

}  // namespace hsgd::nn
