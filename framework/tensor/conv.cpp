// conv2d: shape checks and autograd wiring around the im2col + sgemm kernels of conv_kernels.h.

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/kernels/conv_kernels.h"
#include "framework/tensor/nn_ops.h"

namespace hsgd {

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, Size2 stride, Size2 padding) {
  HSGD_CHECK(x.defined() && w.defined(), "conv2d: input and weight must be defined");
  HSGD_CHECK(x.dim() == 4, "conv2d: input must be 4-D (N,C,H,W), got shape ", shape_str(x.shape()));
  HSGD_CHECK(w.dim() == 4, "conv2d: weight must be 4-D (O,C,kh,kw), got shape ",
             shape_str(w.shape()));
  HSGD_CHECK(w.size(1) == x.size(1), "conv2d: weight ", shape_str(w.shape()), " expects ",
             w.size(1), " input channels but the input ", shape_str(x.shape()), " has ", x.size(1));
  if (b.defined()) {
    HSGD_CHECK(b.dim() == 1 && b.size(0) == w.size(0), "conv2d: bias must have shape [", w.size(0),
               "] (one per output channel), got ", shape_str(b.shape()));
  }
  const kernels::Conv2dGeometry g = kernels::make_conv2d_geometry(
      x.size(0), x.size(1), x.size(2), x.size(3), w.size(0), w.size(2), w.size(3), stride[0],
      stride[1], padding[0], padding[1]);

  const Tensor xc = x.contiguous();
  const Tensor wc = w.contiguous();
  const Tensor bc = b.defined() ? b.contiguous() : Tensor();
  Tensor y = empty({g.n, g.o, g.oh, g.ow});
  kernels::conv2d_forward(xc.data(), wc.data(), bc.defined() ? bc.data() : nullptr, g, y.data());

  if (autograd::needs_grad({xc, wc, bc})) {
    autograd::record(
        y, "Conv2dBackward", {xc, wc, bc},
        [x = xc.detach(), w = wc.detach(), g](const Tensor& gy, const autograd::NeedsGrad& needs) {
          const Tensor gyc = gy.contiguous();
          std::vector<Tensor> grads(3);
          if (needs[0]) grads[0] = empty(x.shape());
          if (needs[1]) grads[1] = empty(w.shape());
          if (needs[2]) grads[2] = empty({g.o});
          kernels::conv2d_backward(x.data(), w.data(), gyc.data(), g,
                                   grads[0].defined() ? grads[0].data() : nullptr,
                                   grads[1].defined() ? grads[1].data() : nullptr,
                                   grads[2].defined() ? grads[2].data() : nullptr);
          return grads;
        });
  }
  return y;
}

}  // namespace hsgd
