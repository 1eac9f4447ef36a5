// layer_norm forward and backward: one row at a time on vecmath's row kernels, rows split
// across the pool.

#include <cmath>

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/kernels/vec_math.h"
#include "framework/parallel/parallel.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"

namespace hsgd {

using autograd::NeedsGrad;

namespace {

// Rows per thread chunk (each row is K values).
constexpr int64_t kRowGrain = 64;

}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  HSGD_CHECK(x.defined(), "layer_norm: the input is undefined");
  HSGD_CHECK(!normalized_shape.empty(), "layer_norm: normalized_shape must not be empty");
  HSGD_CHECK(eps >= 0, "layer_norm: eps ", eps, " must be >= 0");
  const size_t nd = normalized_shape.size();
  const Shape& xs = x.shape();
  const bool trailing_match =
      xs.size() >= nd && Shape(xs.end() - static_cast<int64_t>(nd), xs.end()) == normalized_shape;
  HSGD_CHECK(trailing_match, "layer_norm: normalized_shape ", shape_str(normalized_shape),
             " must equal the last ", nd, " dimension(s) of the input, got input shape ",
             shape_str(xs));
  for (const Tensor* t : {&weight, &bias}) {
    HSGD_CHECK(!t->defined() || t->shape() == normalized_shape,
               "layer_norm: ", t == &weight ? "weight" : "bias", " has shape ",
               shape_str(t->shape()), ", expected normalized_shape ", shape_str(normalized_shape));
  }
  const int64_t k = shape_numel(normalized_shape);
  HSGD_CHECK(k > 0, "layer_norm: normalized_shape ", shape_str(normalized_shape),
             " has no elements");
  const int64_t m = x.numel() / k;

  const Tensor xc = x.detach().contiguous();
  const Tensor wc = weight.defined() ? weight.detach().contiguous() : Tensor();
  const Tensor bc = bias.defined() ? bias.detach().contiguous() : Tensor();
  Tensor out = empty(xs);
  Tensor xhat = empty(xs);   // (M,K) normalised input, saved for backward
  Tensor rstd = empty({m});  // (M) 1 / sqrt(var + eps)
  {
    const float* px = xc.data();
    const float* pw = wc.defined() ? wc.data() : nullptr;
    const float* pb = bc.defined() ? bc.data() : nullptr;
    float* py = out.data();
    float* ph = xhat.data();
    float* pr = rstd.data();
    const float eps_f = static_cast<float>(eps);
    parallel_for(0, m, kRowGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        pr[r] = kernels::vecmath::layer_norm(px + r * k, pw, pb, eps_f, ph + r * k, py + r * k, k);
      }
    });
  }
  if (autograd::needs_grad({x, weight, bias})) {
    autograd::record(
        out, "LayerNormBackward", {x, weight, bias},
        [xhat, rstd, wc, m, k, ns = normalized_shape](const Tensor& g, const NeedsGrad& needs) {
          const Tensor gc = g.contiguous();  // (M,K)
          const float* pg = gc.data();
          const float* ph = xhat.data();
          std::vector<Tensor> grads(3);
          if (needs[0]) {
            Tensor gx = empty(xhat.shape());
            const float* pw = wc.defined() ? wc.data() : nullptr;
            const float* pr = rstd.data();
            float* pgx = gx.data();
            // gx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)), gh = g * weight.
            parallel_for(0, m, kRowGrain, [&](int64_t lo, int64_t hi) {
              for (int64_t r = lo; r < hi; ++r) {
                kernels::vecmath::layer_norm_backward(pg + r * k, ph + r * k, pw, pr[r],
                                                      pgx + r * k, k);
              }
            });
            grads[0] = gx;
          }
          if (needs[1] || needs[2]) {
            // Column sums over the rows, in double.
            std::vector<double> gw(static_cast<size_t>(k), 0.0), gb(static_cast<size_t>(k), 0.0);
            for (int64_t r = 0; r < m; ++r) {
              for (int64_t j = 0; j < k; ++j) {
                gw[j] += static_cast<double>(pg[r * k + j]) * ph[r * k + j];
                gb[j] += pg[r * k + j];
              }
            }
            auto to_tensor = [&](const std::vector<double>& v) {
              Tensor t = empty(ns);
              for (int64_t j = 0; j < k; ++j) t.data()[j] = static_cast<float>(v[j]);
              return t;
            };
            if (needs[1]) grads[1] = to_tensor(gw);
            if (needs[2]) grads[2] = to_tensor(gb);
          }
          return grads;
        });
  }
  return out;
}

}  // namespace hsgd
