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

// The sums of one contiguous run, in 16 lanes (two 8-float vectors; SSE2 code without AVX) that
// are added in a fixed order at the end, then the scalar tail. Float addition is not reassociated
// without -ffast-math, so the lanes must be spelled out to vectorise; the order is the same on
// every thread count.
using V8 = float __attribute__((vector_size(8 * sizeof(float))));
using V8u = float __attribute__((vector_size(8 * sizeof(float)), aligned(4), may_alias));
constexpr int64_t kW = 8;

// Vectors are passed by reference only: by value their ABI would differ between SSE2 and AVX code.
inline const V8u& at(const float* p) { return *reinterpret_cast<const V8u*>(p); }

inline float lanes_sum(const V8& a, const V8& b) {
  const V8 t = a + b;
  return ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
}

// Runs f(acc0, acc1, k) over [0, len) in steps of 2 kW, then returns the lanes' sum plus
// tail(k) for each remaining k.
template <typename Step, typename Tail>
inline float run_reduce(int64_t len, Step step, Tail tail) {
  V8 a0 = {}, a1 = {};
  int64_t k = 0;
  for (; k + 2 * kW <= len; k += 2 * kW) step(a0, a1, k);
  float total = lanes_sum(a0, a1);
  for (; k < len; ++k) total += tail(k);
  return total;
}

// sum(p)
inline float run_sum(const float* p, int64_t len) {
  return run_reduce(
      len,
      [p](V8& a0, V8& a1, int64_t k) {
        a0 += at(p + k);
        a1 += at(p + k + kW);
      },
      [p](int64_t k) { return p[k]; });
}

// sum((p - centre)^2)
inline float run_centred_squares(const float* p, int64_t len, float centre) {
  return run_reduce(
      len,
      [p, centre](V8& a0, V8& a1, int64_t k) {
        const V8 d0 = at(p + k) - centre, d1 = at(p + k + kW) - centre;
        a0 += d0 * d0;
        a1 += d1 * d1;
      },
      [p, centre](int64_t k) { return (p[k] - centre) * (p[k] - centre); });
}

// sum(g * (p - centre))
inline float run_centred_dot(const float* p, const float* g, int64_t len, float centre) {
  return run_reduce(
      len,
      [p, g, centre](V8& a0, V8& a1, int64_t k) {
        a0 += at(g + k) * (at(p + k) - centre);
        a1 += at(g + k + kW) * (at(p + k + kW) - centre);
      },
      [p, g, centre](int64_t k) { return g[k] * (p[k] - centre); });
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
