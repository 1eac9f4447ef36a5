// max_pool2d, avg_pool2d, adaptive_avg_pool2d: shape checks and autograd wiring around the
// kernels of pool_kernels.h. Pooling is per plane, so (N,C,H,W) and (C,H,W) inputs are both
// handled as P = N*C (or C) planes of H x W.

#include <memory>
#include <vector>

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/tensor/nn_ops.h"
#include "framework/kernels/pool_kernels.h"

namespace hsgd {
namespace {

// Checks that x is (N,C,H,W) or (C,H,W) and returns the number of planes.
int64_t plane_count(const char* op, const Tensor& x) {
  HSGD_CHECK(x.defined(), op, ": input must be defined");
  HSGD_CHECK(x.dim() == 3 || x.dim() == 4, op, ": input must be (N,C,H,W) or (C,H,W), got shape ",
             shape_str(x.shape()));
  return x.dim() == 4 ? x.size(0) * x.size(1) : x.size(0);
}

// x's shape with the last two sizes replaced by (oh, ow).
Shape pooled_shape(const Tensor& x, int64_t oh, int64_t ow) {
  Shape shape = x.shape();
  shape[shape.size() - 2] = oh;
  shape[shape.size() - 1] = ow;
  return shape;
}

kernels::Pool2dGeometry pool_geometry(const char* op, const Tensor& x, Size2 kernel, Size2 stride,
                                      Size2 padding) {
  const int64_t planes = plane_count(op, x);
  // torch's default stride is the kernel size; we spell "default" as {0,0}.
  if (stride[0] == 0 && stride[1] == 0) stride = kernel;
  return kernels::make_pool2d_geometry(op, planes, x.size(-2), x.size(-1), kernel[0], kernel[1],
                                       stride[0], stride[1], padding[0], padding[1]);
}

}  // namespace

Tensor max_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding) {
  const kernels::Pool2dGeometry g = pool_geometry("max_pool2d", x, kernel, stride, padding);
  const Tensor xc = x.contiguous();
  Tensor y = empty(pooled_shape(x, g.oh, g.ow));
  // Winner positions, shared with the backward closure (std::function needs a copyable lambda).
  auto argmax = std::make_shared<std::vector<int32_t>>(g.planes * g.oh * g.ow);
  kernels::max_pool2d_forward(xc.data(), g, y.data(), argmax->data());

  if (autograd::needs_grad({xc})) {
    autograd::record(y, "MaxPool2dBackward", {xc},
                     [shape = xc.shape(), argmax, g](const Tensor& gy, const autograd::NeedsGrad&) {
                       const Tensor gyc = gy.contiguous();
                       Tensor gx = empty(shape);
                       kernels::max_pool2d_backward(gyc.data(), argmax->data(), g, gx.data());
                       return std::vector<Tensor>{gx};
                     });
  }
  return y;
}

Tensor avg_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding) {
  const kernels::Pool2dGeometry g = pool_geometry("avg_pool2d", x, kernel, stride, padding);
  const Tensor xc = x.contiguous();
  Tensor y = empty(pooled_shape(x, g.oh, g.ow));
  kernels::avg_pool2d_forward(xc.data(), g, y.data());

  if (autograd::needs_grad({xc})) {
    autograd::record(y, "AvgPool2dBackward", {xc},
                     [shape = xc.shape(), g](const Tensor& gy, const autograd::NeedsGrad&) {
                       const Tensor gyc = gy.contiguous();
                       Tensor gx = empty(shape);
                       kernels::avg_pool2d_backward(gyc.data(), g, gx.data());
                       return std::vector<Tensor>{gx};
                     });
  }
  return y;
}

Tensor adaptive_avg_pool2d(const Tensor& x, Size2 output_size) {
  const int64_t planes = plane_count("adaptive_avg_pool2d", x);
  const int64_t h = x.size(-2), w = x.size(-1);
  const int64_t oh = output_size[0], ow = output_size[1];
  HSGD_CHECK(oh > 0 && ow > 0, "adaptive_avg_pool2d: output size (", oh, ",", ow,
             ") must be positive");
  HSGD_CHECK(h > 0 && w > 0, "adaptive_avg_pool2d: input ", shape_str(x.shape()),
             " has an empty plane");
  const Tensor xc = x.contiguous();
  Tensor y = empty(pooled_shape(x, oh, ow));
  kernels::adaptive_avg_pool2d_forward(xc.data(), planes, h, w, oh, ow, y.data());

  if (autograd::needs_grad({xc})) {
    autograd::record(
        y, "AdaptiveAvgPool2dBackward", {xc},
        [shape = xc.shape(), planes, h, w, oh, ow](const Tensor& gy, const autograd::NeedsGrad&) {
          const Tensor gyc = gy.contiguous();
          Tensor gx = empty(shape);
          kernels::adaptive_avg_pool2d_backward(gyc.data(), planes, h, w, oh, ow, gx.data());
          return std::vector<Tensor>{gx};
        });
  }
  return y;
}

}  // namespace hsgd
