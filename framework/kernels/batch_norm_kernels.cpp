#include "framework/kernels/batch_norm_kernels.h"

#include <algorithm>

#include "framework/parallel/parallel.h"

namespace hsgd::kernels {
namespace {

// Channels (or planes) per thread are at least this many floats of work. Every channel is
// computed by one thread in a fixed order, so results do not depend on the thread count.
constexpr int64_t kGrainFloats = 16384;

int64_t grain_for(int64_t floats_per_item) {
  return std::max<int64_t>(1, kGrainFloats / std::max<int64_t>(1, floats_per_item));
}

// The sums of one contiguous run, in 8 or 16 lanes (SSE vectors, the x86-64 baseline) that are
// added in a fixed order at the end, then the scalar tail. Float addition is not reassociated
// without -ffast-math, so the lanes must be spelled out to vectorise; the order is the same on
// every thread count.
using V4 = float __attribute__((vector_size(4 * sizeof(float))));
using V4u = float __attribute__((vector_size(4 * sizeof(float)), aligned(4), may_alias));
constexpr int64_t kW = 4, kStep = 4 * kW;

inline V4 at(const float* p) { return *reinterpret_cast<const V4u*>(p); }

inline float lanes_sum(V4 a0, V4 a1, V4 a2, V4 a3) {
  const V4 t = (a0 + a1) + (a2 + a3);
  return (t[0] + t[2]) + (t[1] + t[3]);
}

// sum(p)
inline float run_sum(const float* p, int64_t len) {
  V4 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t k = 0;
  for (; k + kStep <= len; k += kStep) {
    a0 += at(p + k), a1 += at(p + k + kW), a2 += at(p + k + 2 * kW), a3 += at(p + k + 3 * kW);
  }
  float total = lanes_sum(a0, a1, a2, a3);
  for (; k < len; ++k) total += p[k];
  return total;
}

// sum((p - centre)^2)
inline float run_centred_squares(const float* p, int64_t len, float centre) {
  V4 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t k = 0;
  for (; k + kStep <= len; k += kStep) {
    const V4 d0 = at(p + k) - centre, d1 = at(p + k + kW) - centre;
    const V4 d2 = at(p + k + 2 * kW) - centre, d3 = at(p + k + 3 * kW) - centre;
    a0 += d0 * d0, a1 += d1 * d1, a2 += d2 * d2, a3 += d3 * d3;
  }
  float total = lanes_sum(a0, a1, a2, a3);
  for (; k < len; ++k) total += (p[k] - centre) * (p[k] - centre);
  return total;
}

// Gradient lanes of a plane fused with ReLU's backward: g where relu_out > 0, else 0.
using V4i = int __attribute__((vector_size(4 * sizeof(int))));
inline V4 masked_at(const float* g, const float* relu_out) {
  return reinterpret_cast<V4>(reinterpret_cast<V4i>(at(g)) & (at(relu_out) > 0.0f));
}

// sum(g) and sum(g * (p - centre)) in one pass, added to sum_g and sum_g_pc; with kMasked, g
// counts only where relu_out > 0. Both forms add in the same lanes and order, so a gradient masked
// here sums exactly as the same gradient masked beforehand.
template <bool kMasked>
inline void run_grad_sums(const float* p, const float* g, const float* relu_out, int64_t len,
                          float centre, double& sum_g, double& sum_g_pc) {
  auto grad = [&](int64_t k) { return kMasked ? masked_at(g + k, relu_out + k) : at(g + k); };
  V4 s0 = {}, s1 = {}, d0 = {}, d1 = {};
  int64_t k = 0;
  for (; k + 2 * kW <= len; k += 2 * kW) {
    const V4 g0 = grad(k), g1 = grad(k + kW);
    s0 += g0, s1 += g1;
    d0 += g0 * (at(p + k) - centre), d1 += g1 * (at(p + k + kW) - centre);
  }
  const V4 zero = {};
  float total = lanes_sum(s0, s1, zero, zero), dot = lanes_sum(d0, d1, zero, zero);
  for (; k < len; ++k) {
    const float gk = !kMasked || relu_out[k] > 0.0f ? g[k] : 0.0f;
    total += gk;
    dot += gk * (p[k] - centre);
  }
  sum_g += total;
  sum_g_pc += dot;
}

}  // namespace

void batch_norm_statistics(const float* x, const BatchNormShape& shape, float* mean, float* var) {
  const int64_t n = shape.n, c = shape.c, s = shape.s;
  const double count = static_cast<double>(shape.count());
  parallel_for(0, c, grain_for(n * s), [&](int64_t lo, int64_t hi) {
    for (int64_t ch = lo; ch < hi; ++ch) {
      double total = 0.0;
      for (int64_t i = 0; i < n; ++i) total += run_sum(x + (i * c + ch) * s, s);
      const float m = static_cast<float>(total / count);
      double squares = 0.0;
      for (int64_t i = 0; i < n; ++i) squares += run_centred_squares(x + (i * c + ch) * s, s, m);
      mean[ch] = m;
      var[ch] = static_cast<float>(squares / count);
    }
  });
}

void batch_norm_normalize(const float* x, const BatchNormShape& shape, const float* mean,
                          const float* invstd, const float* weight, const float* bias, float* y,
                          bool relu, const float* residual) {
  const int64_t n = shape.n, c = shape.c, s = shape.s;
  parallel_for(0, n * c, grain_for(s), [&](int64_t lo, int64_t hi) {
    for (int64_t plane = lo; plane < hi; ++plane) {
      const int64_t i = plane / c, ch = plane % c;
      // y = x * scale + shift with scale = weight*invstd, shift = bias - mean*scale
      const float scale = (weight != nullptr ? weight[ch] : 1.0f) * invstd[ch];
      const float shift = (bias != nullptr ? bias[ch] : 0.0f) - mean[ch] * scale;
      const float* __restrict xp = x + (i * c + ch) * s;
      float* __restrict yp = y + (i * c + ch) * s;
      if (residual != nullptr) {
        const float* __restrict rp = residual + (i * c + ch) * s;
        if (relu) {
          for (int64_t k = 0; k < s; ++k) yp[k] = std::max((xp[k] * scale + shift) + rp[k], 0.0f);
        } else {
          for (int64_t k = 0; k < s; ++k) yp[k] = (xp[k] * scale + shift) + rp[k];
        }
      } else if (relu) {
        // std::max(v, 0) keeps NaN, as relu() does.
        for (int64_t k = 0; k < s; ++k) yp[k] = std::max(xp[k] * scale + shift, 0.0f);
      } else {
        for (int64_t k = 0; k < s; ++k) yp[k] = xp[k] * scale + shift;
      }
    }
  });
}

void batch_norm_backward(const float* x, const float* gy, const BatchNormShape& shape,
                         const float* mean, const float* invstd, const float* weight,
                         bool batch_stats, float* gx, float* gw, float* gb, const float* relu_out,
                         float* g_residual) {
  const int64_t n = shape.n, c = shape.c, s = shape.s;
  const double count = static_cast<double>(shape.count());
  parallel_for(0, c, grain_for(n * s), [&](int64_t lo, int64_t hi) {
    for (int64_t ch = lo; ch < hi; ++ch) {
      const float m = mean[ch], is = invstd[ch];
      // One pass for both reductions: sum(gy) and sum(gy * (x - mean)).
      double sum_gy = 0.0, sum_gy_xc = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t off = (i * c + ch) * s;
        if (relu_out != nullptr) {
          run_grad_sums<true>(x + off, gy + off, relu_out + off, s, m, sum_gy, sum_gy_xc);
        } else {
          run_grad_sums<false>(x + off, gy + off, nullptr, s, m, sum_gy, sum_gy_xc);
        }
      }
      const double sum_gy_xhat = sum_gy_xc * is;
      if (gw != nullptr) gw[ch] = static_cast<float>(sum_gy_xhat);
      if (gb != nullptr) gb[ch] = static_cast<float>(sum_gy);
      const float scale = (weight != nullptr ? weight[ch] : 1.0f) * is;
      // gx = scale * (gy - mean(gy) - (x - mean) * invstd^2 * mean(gy * (x - mean))); without
      // batch statistics gx = scale * gy. With relu_out, gy counts where relu_out > 0 only.
      const float gy_mean = batch_stats ? static_cast<float>(sum_gy / count) : 0.0f;
      const float slope = batch_stats ? static_cast<float>(sum_gy_xc / count) * is * is : 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t off = (i * c + ch) * s;
        const float* __restrict g = gy + off;
        const float* __restrict xp = x + off;
        float* __restrict out = gx != nullptr ? gx + off : nullptr;
        float* __restrict res = g_residual != nullptr ? g_residual + off : nullptr;
        if (relu_out == nullptr) {
          if (res != nullptr) std::copy(g, g + s, res);
          if (out == nullptr) continue;
          if (!batch_stats) {
            for (int64_t k = 0; k < s; ++k) out[k] = g[k] * scale;
            continue;
          }
          for (int64_t k = 0; k < s; ++k) out[k] = scale * (g[k] - gy_mean - (xp[k] - m) * slope);
          continue;
        }
        const float* __restrict r = relu_out + off;
        // g[k] is read unconditionally so that the selects vectorise.
        if (res != nullptr) {
          // The residual's gradient is written in the pass that reads gy for gx.
          if (out == nullptr) {
            for (int64_t k = 0; k < s; ++k) {
              const float gk = g[k];
              res[k] = r[k] > 0.0f ? gk : 0.0f;
            }
            continue;
          }
          for (int64_t k = 0; k < s; ++k) {
            const float gk = g[k];
            const float masked = r[k] > 0.0f ? gk : 0.0f;
            res[k] = masked;
            out[k] =
                batch_stats ? scale * (masked - gy_mean - (xp[k] - m) * slope) : masked * scale;
          }
          continue;
        }
        if (out == nullptr) continue;
        if (!batch_stats) {
          for (int64_t k = 0; k < s; ++k) {
            const float gk = g[k];
            out[k] = (r[k] > 0.0f ? gk : 0.0f) * scale;
          }
          continue;
        }
        for (int64_t k = 0; k < s; ++k) {
          const float gk = g[k];
          out[k] = scale * ((r[k] > 0.0f ? gk : 0.0f) - gy_mean - (xp[k] - m) * slope);
        }
      }
    }
  });
}

}  // namespace hsgd::kernels
