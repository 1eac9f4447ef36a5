#pragma once
// Pooling layers, as torch.nn.MaxPool2d / AvgPool2d / AdaptiveAvgPool2d (ceil_mode=False;
// AvgPool2d counts zero padding in the divisor). A stride of {0, 0} means "equal to the kernel",
// torch's default.
//
// Usage:
//   auto pool = std::make_shared<nn::MaxPool2d>(Size2{2, 2});            // halves H and W
//   auto gap = std::make_shared<nn::AdaptiveAvgPool2d>(Size2{1, 1});     // (N,C,H,W) -> (N,C,1,1)

#include "framework/nn/module.h"
#include "framework/tensor/nn_ops.h"

namespace hsgd::nn {

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Size2 kernel, Size2 stride = {0, 0}, Size2 padding = {0, 0})
      : Module("MaxPool2d"), kernel_(kernel), stride_(stride), padding_(padding) {}
  Tensor forward(const Tensor& x) override { return max_pool2d(x, kernel_, stride_, padding_); }

 private:
  Size2 kernel_, stride_, padding_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel, Size2 stride = {0, 0}, Size2 padding = {0, 0})
      : Module("AvgPool2d"), kernel_(kernel), stride_(stride), padding_(padding) {}
  Tensor forward(const Tensor& x) override { return avg_pool2d(x, kernel_, stride_, padding_); }

 private:
  Size2 kernel_, stride_, padding_;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size)
      : Module("AdaptiveAvgPool2d"), output_size_(output_size) {}
  Tensor forward(const Tensor& x) override { return adaptive_avg_pool2d(x, output_size_); }

 private:
  Size2 output_size_;
};

}  // namespace hsgd::nn
