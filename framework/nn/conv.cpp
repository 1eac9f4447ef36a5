#include "framework/nn/conv.h"

#include "comm/error.h"
#include "framework/nn/init.h"

namespace hsgd::nn {
namespace {

Shape weight_shape(const Conv2dOptions& o) {
  return {o.out_channels, o.in_channels, o.kernel_size[0], o.kernel_size[1]};
}

}  // namespace

Conv2d::Conv2d(const Conv2dOptions& options) : Module("Conv2d"), options_(options) {
  with_default_generator([&](Generator& gen) { reset_parameters(gen); });
}

Conv2d::Conv2d(const Conv2dOptions& options, Generator& gen) : Module("Conv2d"), options_(options) {
  reset_parameters(gen);
}

void Conv2d::reset_parameters(Generator& gen) {
  const Conv2dOptions& o = options_;
  HSGD_CHECK(o.in_channels > 0 && o.out_channels > 0, "Conv2d: in_channels ", o.in_channels,
             " and out_channels ", o.out_channels, " must be positive");
  HSGD_CHECK(o.kernel_size[0] > 0 && o.kernel_size[1] > 0, "Conv2d: kernel_size (",
             o.kernel_size[0], ", ", o.kernel_size[1], ") must be positive");
  HSGD_CHECK(o.stride[0] > 0 && o.stride[1] > 0, "Conv2d: stride (", o.stride[0], ", ", o.stride[1],
             ") must be positive");
  HSGD_CHECK(o.padding[0] >= 0 && o.padding[1] >= 0, "Conv2d: padding (", o.padding[0], ", ",
             o.padding[1], ") must be non-negative");
  const int64_t fan_in = o.in_channels * o.kernel_size[0] * o.kernel_size[1];
  weight_ = register_parameter("weight", init::default_uniform(weight_shape(o), fan_in, gen));
  if (o.bias) {
    bias_ = register_parameter("bias", init::default_uniform({o.out_channels}, fan_in, gen));
  }
}

Tensor Conv2d::forward(const Tensor& x) {
  HSGD_CHECK(x.defined() && x.dim() == 4, "Conv2d: input must be (N,C,H,W), got shape ",
             x.defined() ? shape_str(x.shape()) : "undefined");
  HSGD_CHECK(x.size(1) == options_.in_channels, "Conv2d: input has ", x.size(1),
             " channels (shape ", shape_str(x.shape()),
             "), expected in_channels = ", options_.in_channels);
  return conv2d(x, weight_, bias_, options_.stride, options_.padding);
}

}  // namespace hsgd::nn
