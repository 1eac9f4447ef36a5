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

// Sums of one contiguous run. Four independent accumulators let the compiler keep several
// additions in flight (float addition is not reassociated without -ffast-math).
inline float run_sum(const float* p, int64_t len) {
  float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  int64_t k = 0;
  for (; k + 4 <= len; k += 4) {
    a0 += p[k], a1 += p[k + 1], a2 += p[k + 2], a3 += p[k + 3];
  }
  for (; k < len; ++k) a0 += p[k];
  return (a0 + a1) + (a2 + a3);
}

// sum((p - centre)^2)
inline float run_centred_squares(const float* p, int64_t len, float centre) {
  float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  int64_t k = 0;
  for (; k + 4 <= len; k += 4) {
    const float d0 = p[k] - centre, d1 = p[k + 1] - centre;
    const float d2 = p[k + 2] - centre, d3 = p[k + 3] - centre;
    a0 += d0 * d0, a1 += d1 * d1, a2 += d2 * d2, a3 += d3 * d3;
  }
  for (; k < len; ++k) {
    const float d = p[k] - centre;
    a0 += d * d;
  }
  return (a0 + a1) + (a2 + a3);
}

// sum(g * (p - centre))
inline float run_centred_dot(const float* p, const float* g, int64_t len, float centre) {
  float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  int64_t k = 0;
  for (; k + 4 <= len; k += 4) {
    a0 += g[k] * (p[k] - centre), a1 += g[k + 1] * (p[k + 1] - centre);
    a2 += g[k + 2] * (p[k + 2] - centre), a3 += g[k + 3] * (p[k + 3] - centre);
  }
  for (; k < len; ++k) a0 += g[k] * (p[k] - centre);
  return (a0 + a1) + (a2 + a3);
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
                          const float* invstd, const float* weight, const float* bias, float* y) {
  const int64_t n = shape.n, c = shape.c, s = shape.s;
  parallel_for(0, n * c, grain_for(s), [&](int64_t lo, int64_t hi) {
    for (int64_t plane = lo; plane < hi; ++plane) {
      const int64_t i = plane / c, ch = plane % c;
      // y = x * scale + shift with scale = weight*invstd, shift = bias - mean*scale
      const float scale = (weight != nullptr ? weight[ch] : 1.0f) * invstd[ch];
      const float shift = (bias != nullptr ? bias[ch] : 0.0f) - mean[ch] * scale;
      const float* xp = x + (i * c + ch) * s;
      float* yp = y + (i * c + ch) * s;
      for (int64_t k = 0; k < s; ++k) yp[k] = xp[k] * scale + shift;
    }
  });
}

void batch_norm_backward(const float* x, const float* gy, const BatchNormShape& shape,
                         const float* mean, const float* invstd, const float* weight,
                         bool batch_stats, float* gx, float* gw, float* gb) {
  const int64_t n = shape.n, c = shape.c, s = shape.s;
  const double count = static_cast<double>(shape.count());
  parallel_for(0, c, grain_for(n * s), [&](int64_t lo, int64_t hi) {
    for (int64_t ch = lo; ch < hi; ++ch) {
      const float m = mean[ch], is = invstd[ch];
      // One pass for both reductions: sum(gy) and sum(gy * (x - mean)).
      double sum_gy = 0.0, sum_gy_xc = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t off = (i * c + ch) * s;
        sum_gy += run_sum(gy + off, s);
        sum_gy_xc += run_centred_dot(x + off, gy + off, s, m);
      }
      const double sum_gy_xhat = sum_gy_xc * is;
      if (gw != nullptr) gw[ch] = static_cast<float>(sum_gy_xhat);
      if (gb != nullptr) gb[ch] = static_cast<float>(sum_gy);
      if (gx == nullptr) continue;

      const float scale = (weight != nullptr ? weight[ch] : 1.0f) * is;
      if (!batch_stats) {
        for (int64_t i = 0; i < n; ++i) {
          const int64_t off = (i * c + ch) * s;
          for (int64_t k = 0; k < s; ++k) gx[off + k] = gy[off + k] * scale;
        }
        continue;
      }
      // gx = scale * (gy - mean(gy) - (x - mean) * invstd^2 * mean(gy * (x - mean)))
      const float gy_mean = static_cast<float>(sum_gy / count);
      const float slope = static_cast<float>(sum_gy_xc / count) * is * is;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t off = (i * c + ch) * s;
        for (int64_t k = 0; k < s; ++k) {
          gx[off + k] = scale * (gy[off + k] - gy_mean - (x[off + k] - m) * slope);
        }
      }
    }
  });
}

}  // namespace hsgd::kernels
