// The functions of vec_math.h, written once on GCC vectors and instantiated per instruction set:
// 16 lanes (one zmm register) for AVX-512, 8 (one ymm) for AVX2+FMA, 4 (one xmm) for the SSE2
// baseline, so that no path spills a vector wider than its registers (see conv_simd.h).
//
// This file is compiled with -ffp-contract=fast (framework/CMakeLists.txt): a * b + c becomes one
// FMA on the AVX paths. Every step below is exact or more accurate under contraction, so the
// results differ between paths only by rounding.
//
// Formulas:
//   exp(x):  n = round(x log2 e), r = x - n ln2 (ln2 in a hi part exact for the n in range and a
//            lo part), e^r by its degree-7 Taylor polynomial (|r| <= ln2 / 2: truncation below
//            0.1 ulp), times 2^n built in the exponent bits as 2^(n/2) 2^(n - n/2), which covers
//            subnormal and overflowing results with one rounding.
//   Phi(x):  with a = |x|, z = a / sqrt 2 and t = 1 / (1 + z / 2), the Chebyshev fit of
//            erfc(z) = t exp(-z^2 + P(t)) (Numerical Recipes, section 6.2; relative error below
//            1.2e-7 for every z >= 0); Phi(x) = erfc(z) / 2 for x < 0, 1 - erfc(z) / 2 otherwise.
//            -z^2 = -a^2 / 2 is passed to exp as an exact hi part plus a small lo part: a rounded
//            product would err by a^2 / 2 * 2^-24 in the exponent, 30 ulp at a = 9.
//   sigmoid: from e = exp(-|v|) <= 1, s = 1 / (1 + e) for v >= 0 and e / (1 + e) below, and
//            1 - s the other one: no overflow and no cancellation in either tail.

#include "framework/kernels/vec_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "comm/error.h"

namespace hsgd::kernels::vecmath {
namespace {

using simd::Isa;

using V16 = simd::Vec;
using I16 = simd::Mask;
using V8 = simd::V8;
using I8 = simd::Mask8;
using V4 = float __attribute__((vector_size(4 * sizeof(float))));
using I4 = int __attribute__((vector_size(4 * sizeof(int))));

// The integer vector of a float vector, and its lane count.
template <typename V>
struct Lanes;
template <>
struct Lanes<V16> {
  using I = I16;
  static constexpr int kCount = 16;
};
template <>
struct Lanes<V8> {
  using I = I8;
  static constexpr int kCount = 8;
};
template <>
struct Lanes<V4> {
  using I = I4;
  static constexpr int kCount = 4;
};

template <typename V>
HSGD_INLINE void load(V& v, const float* p) {
  std::memcpy(&v, p, sizeof(V));
}
template <typename V>
HSGD_INLINE void store(float* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

// out = |x| (clears the sign bit; NaN stays NaN).
template <typename V>
HSGD_INLINE void abs(const V& x, V& out) {
  using I = typename Lanes<V>::I;
  out = (V)((I)x & 0x7fffffff);
}

// x clamped to [lo, hi]; NaN stays NaN (both comparisons are false).
template <typename V>
HSGD_INLINE void clamp(V& x, float lo, float hi) {
  x = x < lo ? V{} + lo : x;
  x = x > hi ? V{} + hi : x;
}

// ---- exp ----

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;  // 355 / 512: n kLn2Hi is exact for |n| < 2^15
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: (v + it) - it rounds v to an integer
// Beyond these exp is 0 (below e^-103.98 = 2^-150, half the smallest subnormal) or +inf; the
// clamp keeps n within the two-factor scaling's range [-252, 254].
constexpr float kExpMin = -110.0f;
constexpr float kExpMax = 89.0f;

// out = exp(hi + lo) 2^kScale. Without kHasLo, lo is ignored. With it, |lo| < 2 and hi must be a
// multiple of 2^-13 (as minus_half_square's is), so that hi - n ln2_hi is exact although n is
// rounded from hi + lo.
template <typename V, bool kHasLo, int kScale = 0>
HSGD_INLINE void exp_core(const V& hi, const V& lo, V& out) {
  using I = typename Lanes<V>::I;
  // The scaled result must still be 0 below the clamp: n then stays >= -252 + kScale - 24.
  constexpr float kMin = kExpMin - kScale * 0.6931472f;
  V x = hi;
  clamp(x, kMin, kExpMax);
  V sum = x;
  if constexpr (kHasLo) {
    sum = x + lo;
    clamp(sum, kMin, kExpMax);
  }
  const V nf = (sum * kLog2e + kRoundMagic) - kRoundMagic;
  // Exact without lo: the two terms are within a factor 2 of each other, or n = 0.
  V r = x - nf * kLn2Hi;
  if constexpr (kHasLo) r = r + lo;
  r = r - nf * kLn2Lo;
  V p = V{} + 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n as two normal factors (NaN lanes make garbage scales, but p is NaN there).
  const I n = __builtin_convertvector(nf, I) + kScale;
  const I n1 = n >> 1;
  const I n2 = n - n1;
  const V s1 = (V)((n1 + 127) << 23);
  const V s2 = (V)((n2 + 127) << 23);
  out = p * s1 * s2;
}

// ---- Phi, sigmoid ----

constexpr float kHalfInvSqrt2 = 0.353553390593273762f;  // z / 2 = a / (2 sqrt 2)
constexpr float kInvSqrt2Pi = 0.398942280401432678f;    // 1 / sqrt(2 pi)
constexpr float kSplitMagic = 196608.0f;                // 1.5 * 2^17: rounds to a multiple of 2^-6
// Phi(-20) = 2.8e-89: beyond |x| = 20 the tails are exactly 0 in float and a^2 cannot overflow.
constexpr float kTailMax = 20.0f;

// -a^2 / 2 = hi + lo for 0 <= a <= kTailMax: ah = a rounded to a multiple of 2^-6 has at most 11
// significant bits, so ah^2 is exact, and a^2 = ah^2 + (a + ah)(a - ah) with a - ah exact.
template <typename V>
HSGD_INLINE void minus_half_square(const V& a, V& hi, V& lo) {
  const V ah = (a + kSplitMagic) - kSplitMagic;
  hi = -0.5f * ah * ah;
  lo = -0.5f * (a + ah) * (a - ah);
}

// Phi(-|x|) and phi(x) are scaled by 2^kTailScale: in the negative tail they become subnormal
// before x Phi(x) or x phi(x) does, and would lose their digits there.
constexpr int kTailScale = 24;
constexpr float kTailUnscale = 1.0f / (1 << kTailScale);

// q = Phi(-|x|) 2^kTailScale; with kPdf also pdf = phi(x) 2^kTailScale, phi(x) the normal
// density exp(-x^2 / 2) / sqrt(2 pi).
template <typename V, bool kPdf>
HSGD_INLINE void normal_tail(const V& x, V& q, V& pdf) {
  V a;
  abs(x, a);
  clamp(a, 0.0f, kTailMax);
  const V t = 1.0f / (1.0f + a * kHalfInvSqrt2);
  V p = V{} + 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  V hi, lo;
  minus_half_square(a, hi, lo);
  V e;
  exp_core<V, true, kTailScale>(hi, lo + p, e);
  q = 0.5f * t * e;  // erfc(z) / 2 = Phi(-a)
  if constexpr (kPdf) {
    exp_core<V, true, kTailScale>(hi, lo, e);
    pdf = e * kInvSqrt2Pi;
  }
}

// sigmoid(v) and 1 - sigmoid(v) as big = 1 / (1 + e), the one >= 1/2, and small = e / (1 + e)
// 2^kTailScale, e = exp(-|v|): sigmoid(v) = big for v >= 0, small 2^-kTailScale below.
template <typename V>
HSGD_INLINE void sigmoid_parts(const V& v, V& big, V& small) {
  V a;
  abs(v, a);
  V e;
  exp_core<V, false, kTailScale>(-a, a, e);
  big = 1.0f / (1.0f + e * kTailUnscale);
  small = e * big;
}

// out = x sigmoid(v) (forward) or g sigmoid(v) (1 + x (1 - sigmoid(v)) dv) (backward, dv = 1
// for silu), from sigmoid_parts; x and v have the same sign.
template <typename V, bool kBackward>
HSGD_INLINE void times_sigmoid(const V& g, const V& x, const V& v, const V& dv, V& out) {
  V big, small;
  sigmoid_parts(v, big, small);
  const auto negative = v < 0.0f;
  if constexpr (!kBackward) {
    out = negative ? (x * small) * kTailUnscale : x * big;
  } else {
    // v < 0: sigmoid(v) (1 + x dv big), scaled by 2^kTailScale; below v = -16 that factor is
    // under 2^-8 and g times it cannot overflow.
    const V tail = small * (1.0f + x * dv * big);
    const V head = big * (1.0f + x * dv * (small * kTailUnscale));
    const V d = negative ? tail * kTailUnscale : head;
    out = v < -16.0f ? (g * tail) * kTailUnscale : g * d;
  }
}

constexpr float kTwoSqrt2OverPi = 1.59576912160573071f;  // 2 sqrt(2 / pi)
constexpr float kTanhCubic = 0.044715f;
// sigmoid(2u) at |x| = 12 is e^-142 from 0 or 1: 0 and 1 in float, and x^3 cannot overflow.
constexpr float kTanhMax = 12.0f;

// ---- the elementwise ops ----

enum class Op { kExp, kGelu, kGeluBackward, kGeluTanh, kGeluTanhBackward, kSilu, kSiluBackward };

constexpr bool has_gradient(Op op) {
  return op == Op::kGeluBackward || op == Op::kGeluTanhBackward || op == Op::kSiluBackward;
}

// out = op(x), or g * op'(x) for the backward ops.
template <typename V, Op op>
HSGD_INLINE void apply(const V& g, const V& x, V& out) {
  if constexpr (op == Op::kExp) {
    exp_core<V, false>(x, x, out);
  } else if constexpr (op == Op::kGelu || op == Op::kGeluBackward) {
    V q, pdf;  // scaled by 2^kTailScale
    normal_tail<V, op == Op::kGeluBackward>(x, q, pdf);
    const auto negative = x < 0.0f;
    const V upper = 1.0f - q * kTailUnscale;  // Phi(|x|)
    if constexpr (op == Op::kGelu) {
      out = negative ? (x * q) * kTailUnscale : x * upper;
    } else {
      // Below x = -9 the scaled derivative is under 2^-32: g times it cannot overflow.
      const V tail = q + x * pdf;
      const V d = negative ? tail * kTailUnscale : upper + x * (pdf * kTailUnscale);
      out = x < -9.0f ? (g * tail) * kTailUnscale : g * d;
    }
  } else if constexpr (op == Op::kGeluTanh || op == Op::kGeluTanhBackward) {
    V xc = x;
    clamp(xc, -kTanhMax, kTanhMax);
    const V x2 = xc * xc;
    const V v = kTwoSqrt2OverPi * xc * (1.0f + kTanhCubic * x2);  // 2u
    const V dv = kTwoSqrt2OverPi * (1.0f + 3.0f * kTanhCubic * x2);
    times_sigmoid<V, op == Op::kGeluTanhBackward>(g, x, v, dv, out);
  } else {
    const V one = V{} + 1.0f;
    times_sigmoid<V, op == Op::kSiluBackward>(g, x, x, one, out);
  }
}

// y (n) = op over x (n) (and g (n) for the backward ops); the last partial vector goes through
// a padded copy so that no access leaves the arrays.
template <typename V, Op op>
HSGD_INLINE void map(const float* g, const float* x, float* y, int64_t n) {
  constexpr int kL = Lanes<V>::kCount;
  int64_t i = 0;
  V gv{}, xv, out;
  for (; i + kL <= n; i += kL) {
    if constexpr (has_gradient(op)) load(gv, g + i);
    load(xv, x + i);
    apply<V, op>(gv, xv, out);
    store(y + i, out);
  }
  if (i == n) return;
  const int64_t rest = n - i;
  float gb[kL] = {}, xb[kL] = {}, yb[kL];
  if constexpr (has_gradient(op)) std::memcpy(gb, g + i, rest * sizeof(float));
  std::memcpy(xb, x + i, rest * sizeof(float));
  load(gv, gb);
  load(xv, xb);
  apply<V, op>(gv, xv, out);
  store(yb, out);
  std::memcpy(y + i, yb, rest * sizeof(float));
}

template <typename V>
HSGD_INLINE void map_op(Op op, const float* g, const float* x, float* y, int64_t n) {
  switch (op) {
    case Op::kExp:
      return map<V, Op::kExp>(g, x, y, n);
    case Op::kGelu:
      return map<V, Op::kGelu>(g, x, y, n);
    case Op::kGeluBackward:
      return map<V, Op::kGeluBackward>(g, x, y, n);
    case Op::kGeluTanh:
      return map<V, Op::kGeluTanh>(g, x, y, n);
    case Op::kGeluTanhBackward:
      return map<V, Op::kGeluTanhBackward>(g, x, y, n);
    case Op::kSilu:
      return map<V, Op::kSilu>(g, x, y, n);
    case Op::kSiluBackward:
      return map<V, Op::kSiluBackward>(g, x, y, n);
  }
}

// ---- exp_shifted ----

// Vectors per float partial sum: each lane adds at most 32 terms before the sum moves to double.
constexpr int64_t kSumBlock = 32;

template <typename V>
HSGD_INLINE double exp_shifted_sum(const float* x, float shift, float* y, int64_t n) {
  constexpr int kL = Lanes<V>::kCount;
  double total = 0;
  int64_t i = 0;
  V xv, e;
  // A row of at least one vector ends with the vector of its last kL entries, loaded before y
  // (which may be x) is written; exponentiated again, its entries get the bits they got before,
  // and only the new ones are summed. (A padded copy stalls on store forwarding, which costs more
  // than a short row of attention scores.)
  V last;
  const bool overlap = n > kL && n % kL != 0;
  if (overlap) load(last, x + n - kL);
  while (i + kL <= n) {
    V acc{};
    for (int64_t b = 0; b < kSumBlock && i + kL <= n; ++b, i += kL) {
      load(xv, x + i);
      xv = xv - shift;
      exp_core<V, false>(xv, xv, e);
      store(y + i, e);
      acc += e;
    }
    for (int l = 0; l < kL; ++l) total += acc[l];
  }
  if (i == n) return total;
  const int64_t rest = n - i;
  if (overlap) {
    last = last - shift;
    exp_core<V, false>(last, last, e);
    store(y + n - kL, e);
    for (int64_t l = kL - rest; l < kL; ++l) total += e[l];
    return total;
  }
  float xb[kL], yb[kL];
  for (int l = 0; l < kL; ++l) xb[l] = -__builtin_inff();  // exp(-inf - shift) = 0
  std::memcpy(xb, x + i, rest * sizeof(float));
  load(xv, xb);
  xv = xv - shift;
  exp_core<V, false>(xv, xv, e);
  store(yb, e);
  std::memcpy(y + i, yb, rest * sizeof(float));
  for (int l = 0; l < kL; ++l) total += e[l];
  return total;
}

// ---- softmax and layer-norm rows ----

template <typename V>
HSGD_INLINE float max_row(const float* x, int64_t n) {
  constexpr int kL = Lanes<V>::kCount;
  float best = -__builtin_inff();
  int64_t i = 0;
  if (n >= kL) {
    V m, xv;
    load(m, x);
    for (i = kL; i + kL <= n; i += kL) {
      load(xv, x + i);
      m = xv > m ? xv : m;
    }
    for (int l = 0; l < kL; ++l) best = std::max(best, m[l]);
  }
  for (; i < n; ++i) best = std::max(best, x[i]);
  return best;
}

template <typename V>
HSGD_INLINE void scale_row(const float* x, float s, float* y, int64_t n) {
  constexpr int kL = Lanes<V>::kCount;
  int64_t i = 0;
  V xv;
  for (; i + kL <= n; i += kL) {
    load(xv, x + i);
    store(y + i, xv * s);
  }
  for (; i < n; ++i) y[i] = x[i] * s;
}

template <typename V>
HSGD_INLINE void softmax_backward_row(const float* p, const float* dp, float delta, float* ds,
                                      int64_t n) {
  constexpr int kL = Lanes<V>::kCount;
  int64_t i = 0;
  V pv, dv;
  for (; i + kL <= n; i += kL) {
    load(pv, p + i);
    load(dv, dp + i);
    store(ds + i, pv * (dv - delta));
  }
  for (; i < n; ++i) ds[i] = p[i] * (dp[i] - delta);
}

// Sums below run in float lanes for kSumBlock vectors at a time, then in double, as
// exp_shifted's; these add one block's lanes.
template <typename V>
HSGD_INLINE void add_lanes(const V& acc, double& total) {
  for (int l = 0; l < Lanes<V>::kCount; ++l) total += acc[l];
}

template <typename V>
HSGD_INLINE double dot_row(const float* a, const float* b, int64_t n) {
  constexpr int kL = Lanes<V>::kCount;
  V av, bv, acc;
  double total = 0;
  int64_t i = 0;
  while (i + kL <= n) {
    acc = V{};
    for (int64_t blk = 0; blk < kSumBlock && i + kL <= n; ++blk, i += kL) {
      load(av, a + i);
      load(bv, b + i);
      acc += av * bv;
    }
    add_lanes(acc, total);
  }
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

template <typename V>
HSGD_INLINE float layer_norm_row(const float* x, const float* w, const float* b, float eps,
                                 float* xhat, float* y, int64_t k) {
  constexpr int kL = Lanes<V>::kCount;
  const double kd = static_cast<double>(k);
  V v, acc, wv, bv;
  double sum = 0;
  int64_t i = 0;
  while (i + kL <= k) {
    acc = V{};
    for (int64_t blk = 0; blk < kSumBlock && i + kL <= k; ++blk, i += kL) {
      load(v, x + i);
      acc += v;
    }
    add_lanes(acc, sum);
  }
  for (; i < k; ++i) sum += x[i];
  const float mean = static_cast<float>(sum / kd);
  double sq = 0;
  i = 0;
  while (i + kL <= k) {
    acc = V{};
    for (int64_t blk = 0; blk < kSumBlock && i + kL <= k; ++blk, i += kL) {
      load(v, x + i);
      v = v - mean;
      acc += v * v;
    }
    add_lanes(acc, sq);
  }
  for (; i < k; ++i) {
    const float d = x[i] - mean;
    sq += d * d;
  }
  const float rstd = static_cast<float>(1.0 / std::sqrt(sq / kd + static_cast<double>(eps)));
  for (i = 0; i + kL <= k; i += kL) {
    load(v, x + i);
    v = (v - mean) * rstd;
    store(xhat + i, v);
    if (w != nullptr) {
      load(wv, w + i);
      v = v * wv;
    }
    if (b != nullptr) {
      load(bv, b + i);
      v = v + bv;
    }
    store(y + i, v);
  }
  for (; i < k; ++i) {
    float h = (x[i] - mean) * rstd;
    xhat[i] = h;
    if (w != nullptr) h = h * w[i];
    if (b != nullptr) h = h + b[i];
    y[i] = h;
  }
  return rstd;
}

template <typename V>
HSGD_INLINE void layer_norm_backward_row(const float* g, const float* xhat, const float* w,
                                         float rstd, float* gx, int64_t k) {
  constexpr int kL = Lanes<V>::kCount;
  const double kd = static_cast<double>(k);
  V gh, h, wv, acc1, acc2;
  double s1 = 0, s2 = 0;
  int64_t i = 0;
  while (i + kL <= k) {
    acc1 = V{};
    acc2 = V{};
    for (int64_t blk = 0; blk < kSumBlock && i + kL <= k; ++blk, i += kL) {
      load(gh, g + i);
      if (w != nullptr) {
        load(wv, w + i);
        gh = gh * wv;
      }
      load(h, xhat + i);
      acc1 += gh;
      acc2 += gh * h;
    }
    add_lanes(acc1, s1);
    add_lanes(acc2, s2);
  }
  for (; i < k; ++i) {
    const float ghs = w != nullptr ? g[i] * w[i] : g[i];
    s1 += ghs;
    s2 += ghs * xhat[i];
  }
  const float mean_gh = static_cast<float>(s1 / kd);
  const float mean_ghh = static_cast<float>(s2 / kd);
  for (i = 0; i + kL <= k; i += kL) {
    load(gh, g + i);
    if (w != nullptr) {
      load(wv, w + i);
      gh = gh * wv;
    }
    load(h, xhat + i);
    store(gx + i, rstd * (gh - mean_gh - h * mean_ghh));
  }
  for (; i < k; ++i) {
    const float ghs = w != nullptr ? g[i] * w[i] : g[i];
    gx[i] = rstd * (ghs - mean_gh - xhat[i] * mean_ghh);
  }
}

// ---- instantiations per instruction set ----

__attribute__((target("avx512f,avx2,fma"))) void map_avx512(Op op, const float* g, const float* x,
                                                            float* y, int64_t n) {
  map_op<V16>(op, g, x, y, n);
}
__attribute__((target("avx2,fma"))) void map_avx2(Op op, const float* g, const float* x, float* y,
                                                  int64_t n) {
  map_op<V8>(op, g, x, y, n);
}
void map_baseline(Op op, const float* g, const float* x, float* y, int64_t n) {
  map_op<V4>(op, g, x, y, n);
}

__attribute__((target("avx512f,avx2,fma"))) double exp_shifted_avx512(const float* x, float shift,
                                                                      float* y, int64_t n) {
  return exp_shifted_sum<V16>(x, shift, y, n);
}
__attribute__((target("avx2,fma"))) double exp_shifted_avx2(const float* x, float shift, float* y,
                                                            int64_t n) {
  return exp_shifted_sum<V8>(x, shift, y, n);
}
double exp_shifted_baseline(const float* x, float shift, float* y, int64_t n) {
  return exp_shifted_sum<V4>(x, shift, y, n);
}

// The row kernels, one wrapper per instruction set (the same three targets as above).
#define HSGD_AVX512_TARGET __attribute__((target("avx512f,avx2,fma")))
#define HSGD_AVX2_TARGET __attribute__((target("avx2,fma")))

HSGD_AVX512_TARGET float max_avx512(const float* x, int64_t n) { return max_row<V16>(x, n); }
HSGD_AVX2_TARGET float max_avx2(const float* x, int64_t n) { return max_row<V8>(x, n); }
float max_baseline(const float* x, int64_t n) { return max_row<V4>(x, n); }

HSGD_AVX512_TARGET void scale_avx512(const float* x, float s, float* y, int64_t n) {
  scale_row<V16>(x, s, y, n);
}
HSGD_AVX2_TARGET void scale_avx2(const float* x, float s, float* y, int64_t n) {
  scale_row<V8>(x, s, y, n);
}
void scale_baseline(const float* x, float s, float* y, int64_t n) { scale_row<V4>(x, s, y, n); }

HSGD_AVX512_TARGET void softmax_backward_avx512(const float* p, const float* dp, float delta,
                                                float* ds, int64_t n) {
  softmax_backward_row<V16>(p, dp, delta, ds, n);
}
HSGD_AVX2_TARGET void softmax_backward_avx2(const float* p, const float* dp, float delta, float* ds,
                                            int64_t n) {
  softmax_backward_row<V8>(p, dp, delta, ds, n);
}
void softmax_backward_baseline(const float* p, const float* dp, float delta, float* ds, int64_t n) {
  softmax_backward_row<V4>(p, dp, delta, ds, n);
}

HSGD_AVX512_TARGET double dot_avx512(const float* a, const float* b, int64_t n) {
  return dot_row<V16>(a, b, n);
}
HSGD_AVX2_TARGET double dot_avx2(const float* a, const float* b, int64_t n) {
  return dot_row<V8>(a, b, n);
}
double dot_baseline(const float* a, const float* b, int64_t n) { return dot_row<V4>(a, b, n); }

HSGD_AVX512_TARGET float layer_norm_avx512(const float* x, const float* w, const float* b,
                                           float eps, float* xhat, float* y, int64_t k) {
  return layer_norm_row<V16>(x, w, b, eps, xhat, y, k);
}
HSGD_AVX2_TARGET float layer_norm_avx2(const float* x, const float* w, const float* b, float eps,
                                       float* xhat, float* y, int64_t k) {
  return layer_norm_row<V8>(x, w, b, eps, xhat, y, k);
}
float layer_norm_baseline(const float* x, const float* w, const float* b, float eps, float* xhat,
                          float* y, int64_t k) {
  return layer_norm_row<V4>(x, w, b, eps, xhat, y, k);
}

HSGD_AVX512_TARGET void layer_norm_backward_avx512(const float* g, const float* xhat,
                                                   const float* w, float rstd, float* gx,
                                                   int64_t k) {
  layer_norm_backward_row<V16>(g, xhat, w, rstd, gx, k);
}
HSGD_AVX2_TARGET void layer_norm_backward_avx2(const float* g, const float* xhat, const float* w,
                                               float rstd, float* gx, int64_t k) {
  layer_norm_backward_row<V8>(g, xhat, w, rstd, gx, k);
}
void layer_norm_backward_baseline(const float* g, const float* xhat, const float* w, float rstd,
                                  float* gx, int64_t k) {
  layer_norm_backward_row<V4>(g, xhat, w, rstd, gx, k);
}

#undef HSGD_AVX512_TARGET
#undef HSGD_AVX2_TARGET

void check_isa(Isa isa, const char* op) {
  HSGD_CHECK(simd::isa_supported(isa), "vecmath::", op, ": this CPU cannot run ",
             simd::isa_name(isa), " (it supports ", simd::isa_name(simd::conv_isa()), ")");
}

void run(Op op, const char* name, const float* g, const float* x, float* y, int64_t n, Isa isa) {
  check_isa(isa, name);
  if (n <= 0) return;
  switch (isa) {
    case Isa::kAvx512:
      return map_avx512(op, g, x, y, n);
    case Isa::kAvx2:
      return map_avx2(op, g, x, y, n);
    case Isa::kBaseline:
      return map_baseline(op, g, x, y, n);
  }
}

}  // namespace

void exp(const float* x, float* y, int64_t n, Isa isa) {
  run(Op::kExp, "exp", nullptr, x, y, n, isa);
}

double exp_shifted(const float* x, float shift, float* y, int64_t n, Isa isa) {
  check_isa(isa, "exp_shifted");
  if (n <= 0) return 0;
  switch (isa) {
    case Isa::kAvx512:
      return exp_shifted_avx512(x, shift, y, n);
    case Isa::kAvx2:
      return exp_shifted_avx2(x, shift, y, n);
    case Isa::kBaseline:
      break;
  }
  return exp_shifted_baseline(x, shift, y, n);
}

void gelu(const float* x, float* y, int64_t n, Isa isa) {
  run(Op::kGelu, "gelu", nullptr, x, y, n, isa);
}

void gelu_backward(const float* g, const float* x, float* gx, int64_t n, Isa isa) {
  run(Op::kGeluBackward, "gelu_backward", g, x, gx, n, isa);
}

void gelu_tanh(const float* x, float* y, int64_t n, Isa isa) {
  run(Op::kGeluTanh, "gelu_tanh", nullptr, x, y, n, isa);
}

void gelu_tanh_backward(const float* g, const float* x, float* gx, int64_t n, Isa isa) {
  run(Op::kGeluTanhBackward, "gelu_tanh_backward", g, x, gx, n, isa);
}

void silu(const float* x, float* y, int64_t n, Isa isa) {
  run(Op::kSilu, "silu", nullptr, x, y, n, isa);
}

void silu_backward(const float* g, const float* x, float* gx, int64_t n, Isa isa) {
  run(Op::kSiluBackward, "silu_backward", g, x, gx, n, isa);
}

float max(const float* x, int64_t n, Isa isa) {
  check_isa(isa, "max");
  switch (isa) {
    case Isa::kAvx512:
      return max_avx512(x, n);
    case Isa::kAvx2:
      return max_avx2(x, n);
    case Isa::kBaseline:
      break;
  }
  return max_baseline(x, n);
}

void scale(const float* x, float s, float* y, int64_t n, Isa isa) {
  check_isa(isa, "scale");
  switch (isa) {
    case Isa::kAvx512:
      return scale_avx512(x, s, y, n);
    case Isa::kAvx2:
      return scale_avx2(x, s, y, n);
    case Isa::kBaseline:
      break;
  }
  scale_baseline(x, s, y, n);
}

void softmax_backward(const float* p, const float* dp, float delta, float* ds, int64_t n, Isa isa) {
  check_isa(isa, "softmax_backward");
  switch (isa) {
    case Isa::kAvx512:
      return softmax_backward_avx512(p, dp, delta, ds, n);
    case Isa::kAvx2:
      return softmax_backward_avx2(p, dp, delta, ds, n);
    case Isa::kBaseline:
      break;
  }
  softmax_backward_baseline(p, dp, delta, ds, n);
}

double dot(const float* a, const float* b, int64_t n, Isa isa) {
  check_isa(isa, "dot");
  switch (isa) {
    case Isa::kAvx512:
      return dot_avx512(a, b, n);
    case Isa::kAvx2:
      return dot_avx2(a, b, n);
    case Isa::kBaseline:
      break;
  }
  return dot_baseline(a, b, n);
}

float layer_norm(const float* x, const float* weight, const float* bias, float eps, float* xhat,
                 float* y, int64_t k, Isa isa) {
  check_isa(isa, "layer_norm");
  HSGD_CHECK(k >= 1, "vecmath::layer_norm: row length ", k, " must be >= 1");
  switch (isa) {
    case Isa::kAvx512:
      return layer_norm_avx512(x, weight, bias, eps, xhat, y, k);
    case Isa::kAvx2:
      return layer_norm_avx2(x, weight, bias, eps, xhat, y, k);
    case Isa::kBaseline:
      break;
  }
  return layer_norm_baseline(x, weight, bias, eps, xhat, y, k);
}

void layer_norm_backward(const float* g, const float* xhat, const float* weight, float rstd,
                         float* gx, int64_t k, Isa isa) {
  check_isa(isa, "layer_norm_backward");
  HSGD_CHECK(k >= 1, "vecmath::layer_norm_backward: row length ", k, " must be >= 1");
  switch (isa) {
    case Isa::kAvx512:
      return layer_norm_backward_avx512(g, xhat, weight, rstd, gx, k);
    case Isa::kAvx2:
      return layer_norm_backward_avx2(g, xhat, weight, rstd, gx, k);
    case Isa::kBaseline:
      break;
  }
  layer_norm_backward_baseline(g, xhat, weight, rstd, gx, k);
}

}  // namespace hsgd::kernels::vecmath
