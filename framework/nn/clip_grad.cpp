#include "framework/nn/clip_grad.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "comm/error.h"
#include "framework/tensor/grad_mode.h"

namespace hsgd::nn::utils {

double clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  HSGD_CHECK(max_norm >= 0, "clip_grad_norm_: max_norm ", max_norm, " must be >= 0");
  const bool inf_norm = std::isinf(norm_type) && norm_type > 0;
  HSGD_CHECK(inf_norm || (std::isfinite(norm_type) && norm_type > 0), "clip_grad_norm_: norm_type ",
             norm_type, " must be > 0 or infinity");
  std::vector<Tensor> grads;
  for (const Tensor& p : parameters) {
    HSGD_CHECK(p.defined(), "clip_grad_norm_: parameter ", &p - parameters.data(), " is undefined");
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return 0.0;

  // Per-gradient norms in double, then the norm of the norms (torch.norm(stack(norms))).
  double total = 0;
  for (const Tensor& g : grads) {
    const std::vector<float> values = g.to_vector();
    double norm = 0;
    if (inf_norm) {
      for (float v : values) {
        const double a = std::fabs(static_cast<double>(v));
        norm = std::isnan(a) || std::isnan(norm) ? std::numeric_limits<double>::quiet_NaN()
                                                 : std::max(norm, a);
      }
      total = std::isnan(norm) || std::isnan(total) ? std::numeric_limits<double>::quiet_NaN()
                                                    : std::max(total, norm);
    } else {
      for (float v : values) norm += std::pow(std::fabs(static_cast<double>(v)), norm_type);
      // A float32 per-parameter norm, as torch's stack of float norms.
      const double rounded = static_cast<float>(std::pow(norm, 1.0 / norm_type));
      total += std::pow(rounded, norm_type);
    }
  }
  if (!inf_norm) total = std::pow(total, 1.0 / norm_type);
  total = static_cast<float>(total);
  HSGD_CHECK(!error_if_nonfinite || std::isfinite(total),
             "clip_grad_norm_: the total norm of order ", norm_type, " of the gradients is ", total,
             ", so they cannot be clipped (pass error_if_nonfinite = false to clip anyway)");
  // NaN stays NaN (the gradients become NaN, as torch's clamp leaves it).
  const float ratio = static_cast<float>(max_norm) / (static_cast<float>(total) + 1e-6f);
  const float coef = std::isnan(ratio) ? ratio : std::min(1.0f, ratio);
  NoGradGuard no_grad;
  for (Tensor& g : grads) g.mul_(coef);
  return total;
}

}  // namespace hsgd::nn::utils
