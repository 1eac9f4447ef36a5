// batch_norm: checks, running-statistics update and autograd wiring around the kernels of
// batch_norm_kernels.h.

#include <cmath>
#include <vector>

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/kernels/batch_norm_kernels.h"
#include "framework/tensor/nn_ops.h"

namespace hsgd {
namespace {

// A per-channel argument must be undefined (where allowed) or have shape (C).
void check_channel_vector(const char* what, const Tensor& t, int64_t channels) {
  if (!t.defined()) return;
  HSGD_CHECK(t.dim() == 1 && t.size(0) == channels, "batch_norm: ", what, " must have shape [",
             channels, "] (one value per channel), got ", shape_str(t.shape()));
}

// running = (1 - momentum) * running + momentum * batch, written through running's strides.
void update_running(Tensor& running, const std::vector<float>& batch, double momentum) {
  std::vector<float> updated = running.to_vector();
  for (size_t ch = 0; ch < updated.size(); ++ch) {
    updated[ch] = static_cast<float>((1.0 - momentum) * updated[ch] + momentum * batch[ch]);
  }
  running.copy_(from_vector(std::move(updated)));
}

// batch_norm, plus residual when it is defined, then ReLU when relu, all in the same pass
// (batch_norm_relu, batch_norm_add_relu).
Tensor batch_norm_impl(const Tensor& x, const Tensor& weight, const Tensor& bias,
                       Tensor running_mean, Tensor running_var, bool training, double momentum,
                       double eps, bool relu, const Tensor& residual = Tensor()) {
  HSGD_CHECK(x.defined(), "batch_norm: input must be defined");
  HSGD_CHECK(x.dim() >= 2, "batch_norm: input must be (N,C), (N,C,L) or (N,C,H,W), got shape ",
             shape_str(x.shape()));
  const int64_t c = x.size(1);
  check_channel_vector("weight", weight, c);
  check_channel_vector("bias", bias, c);
  check_channel_vector("running_mean", running_mean, c);
  check_channel_vector("running_var", running_var, c);
  HSGD_CHECK(eps > 0, "batch_norm: eps must be positive, got ", eps);
  HSGD_CHECK(running_mean.defined() == running_var.defined(),
             "batch_norm: running_mean and running_var must be both defined or both undefined");

  kernels::BatchNormShape shape{.n = x.size(0), .c = c, .s = x.numel() / (x.size(0) * c)};
  const int64_t count = shape.count();
  HSGD_CHECK(count > 0, "batch_norm: input ", shape_str(x.shape()), " is empty");

  if (residual.defined()) {
    HSGD_CHECK(residual.shape() == x.shape(), "batch_norm_add_relu: residual ",
               shape_str(residual.shape()), " must have the input's shape ", shape_str(x.shape()));
  }

  const Tensor xc = x.contiguous();
  const Tensor rc = residual.defined() ? residual.contiguous() : Tensor();
  std::vector<float> mean(c), invstd(c);
  if (training) {
    HSGD_CHECK(count > 1, "batch_norm: training needs more than one value per channel, got input ",
               shape_str(x.shape()));
    std::vector<float> var(c);
    kernels::batch_norm_statistics(xc.data(), shape, mean.data(), var.data());
    for (int64_t ch = 0; ch < c; ++ch)
      invstd[ch] = static_cast<float>(1.0 / std::sqrt(var[ch] + eps));
    if (running_mean.defined()) {
      // running_var tracks the unbiased variance while normalisation uses the biased one.
      const double bessel = static_cast<double>(count) / static_cast<double>(count - 1);
      for (float& v : var) v = static_cast<float>(v * bessel);
      update_running(running_mean, mean, momentum);
      update_running(running_var, var, momentum);
    }
  } else {
    HSGD_CHECK(running_mean.defined(),
               "batch_norm: eval mode (training=false) needs running_mean and running_var");
    mean = running_mean.to_vector();
    const std::vector<float> var = running_var.to_vector();
    for (int64_t ch = 0; ch < c; ++ch) {
      HSGD_CHECK(var[ch] + eps > 0, "batch_norm: running_var[", ch, "] = ", var[ch],
                 " makes var + eps non-positive");
      invstd[ch] = static_cast<float>(1.0 / std::sqrt(var[ch] + eps));
    }
  }

  const Tensor wc = weight.defined() ? weight.contiguous() : Tensor();
  const Tensor bc = bias.defined() ? bias.contiguous() : Tensor();
  Tensor y = empty(x.shape());
  kernels::batch_norm_normalize(
      xc.data(), shape, mean.data(), invstd.data(), wc.defined() ? wc.data() : nullptr,
      bc.defined() ? bc.data() : nullptr, y.data(), relu, rc.defined() ? rc.data() : nullptr);

  if (autograd::needs_grad({xc, wc, bc, rc})) {
    // With relu the output is saved (detached) for ReLU's backward: y > 0 exactly where the
    // value before the ReLU is.
    const char* name = rc.defined() ? "BatchNormAddReluBackward"
                       : relu       ? "BatchNormReluBackward"
                                    : "BatchNormBackward";
    autograd::record(
        y, name, {xc, wc, bc, rc},
        [x = xc.detach(), w = wc.defined() ? wc.detach() : Tensor(), shape, training,
         mean = std::move(mean), invstd = std::move(invstd),
         out = relu ? y.detach() : Tensor()](const Tensor& gy, const autograd::NeedsGrad& needs) {
          const Tensor gyc = gy.contiguous();
          std::vector<Tensor> grads(4);
          if (needs[0]) grads[0] = empty(x.shape());
          if (needs[1]) grads[1] = empty({shape.c});
          if (needs[2]) grads[2] = empty({shape.c});
          if (needs[3]) grads[3] = empty(x.shape());
          kernels::batch_norm_backward(x.data(), gyc.data(), shape, mean.data(), invstd.data(),
                                       w.defined() ? w.data() : nullptr, training,
                                       grads[0].defined() ? grads[0].data() : nullptr,
                                       grads[1].defined() ? grads[1].data() : nullptr,
                                       grads[2].defined() ? grads[2].data() : nullptr,
                                       out.defined() ? out.data() : nullptr,
                                       grads[3].defined() ? grads[3].data() : nullptr);
          return grads;
        });
  }
  return y;
}

}  // namespace

Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& weight,
                           const Tensor& bias, Tensor running_mean, Tensor running_var,
                           bool training, double momentum, double eps) {
  HSGD_CHECK(residual.defined(), "batch_norm_add_relu: residual must be defined");
  return batch_norm_impl(x, weight, bias, std::move(running_mean), std::move(running_var), training,
                         momentum, eps, true, residual);
}

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor running_mean,
                  Tensor running_var, bool training, double momentum, double eps) {
  return batch_norm_impl(x, weight, bias, std::move(running_mean), std::move(running_var), training,
                         momentum, eps, false);
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& weight, const Tensor& bias,
                       Tensor running_mean, Tensor running_var, bool training, double momentum,
                       double eps) {
  return batch_norm_impl(x, weight, bias, std::move(running_mean), std::move(running_var), training,
                         momentum, eps, true);
}

}  // namespace hsgd
