#include "framework/kernels/conv_gemm_avx2.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include <immintrin.h>

namespace hsgd::kernels::detail {
namespace {

constexpr int kW = 8;  // floats per register
using V8 = float __attribute__((vector_size(kW * sizeof(float))));

#define HSGD_AVX2 [[gnu::always_inline]] inline __attribute__((target("avx2,fma")))

HSGD_AVX2 V8 load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof(V8));
  return v;
}
HSGD_AVX2 void store8(float* p, V8 v) { std::memcpy(p, &v, sizeof(V8)); }

// ---- nn: blocks of R rows x 2 registers (16 columns): 12 accumulators at R = 6 ----

template <int R, int CV>
HSGD_AVX2 void nn_block(const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                        int64_t ldc, int64_t k, bool add) {
  V8 acc[R][CV] = {};
  if (add) {
    for (int r = 0; r < R; ++r) {
      for (int v = 0; v < CV; ++v) acc[r][v] = load8(c + r * ldc + v * kW);
    }
  }
  for (int64_t i = 0; i < k; ++i) {
    V8 bv[CV];
    for (int v = 0; v < CV; ++v) bv[v] = load8(b + i * ldb + v * kW);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float s = a[r * lda + i];
      for (int v = 0; v < CV; ++v) acc[r][v] += s * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < CV; ++v) store8(c + r * ldc + v * kW, acc[r][v]);
  }
}

template <int CV>
HSGD_AVX2 void nn_columns(int64_t m, int64_t k, const float* a, int64_t lda, const float* b,
                          int64_t ldb, float* c, int64_t ldc, bool add) {
  int64_t r = 0;
  for (; r + 6 <= m; r += 6) nn_block<6, CV>(a + r * lda, lda, b, ldb, c + r * ldc, ldc, k, add);
  switch (m - r) {
    case 5:
      return nn_block<5, CV>(a + r * lda, lda, b, ldb, c + r * ldc, ldc, k, add);
    case 4:
      return nn_block<4, CV>(a + r * lda, lda, b, ldb, c + r * ldc, ldc, k, add);
    case 3:
      return nn_block<3, CV>(a + r * lda, lda, b, ldb, c + r * ldc, ldc, k, add);
    case 2:
      return nn_block<2, CV>(a + r * lda, lda, b, ldb, c + r * ldc, ldc, k, add);
    case 1:
      return nn_block<1, CV>(a + r * lda, lda, b, ldb, c + r * ldc, ldc, k, add);
    default:
      return;
  }
}

// ---- nt: blocks of R x 4 entries of c, each a lane-wise partial sum over k ----
// Up to this many rows of c (the Winograd weight gradients: 16 to 64 channels) the lane-wise
// sums ran at 50-60 GFLOP/s, twice the 2 x 4 blocks they replace at 16 x 16 x 512; the
// transposed nn product below was no faster at 64 rows.
constexpr int64_t kLaneSumMaxRows = 64;

HSGD_AVX2 float lane_sum(V8 x) {
  float l[kW];
  std::memcpy(l, &x, sizeof(V8));
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// The lane sums of a, b, c and d, in that order.
HSGD_AVX2 __m128 lane_sums4(V8 a, V8 b, V8 c, V8 d) {
  const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // four sums of lanes 0-3, then four of lanes 4-7
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// c[r][q] (+)= sum over t < kv of a[r][t] * b[q][t] + the scalar tail t in [kv, k), for the R x 4
// block of c at a's and b's first rows. kv is k rounded down to whole vectors. Each step loads R
// + 4 vectors for 4 R multiply-adds (12 at R = 3, with 4 registers for the operands).
template <int R>
HSGD_AVX2 void nt_block4(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k,
                         bool add, float* c, int64_t ldc) {
  constexpr int kQ = 4;
  V8 acc[R][kQ];
  // Zeroed one by one: "= {}" became a rep stos to the stack, 16% of the kernel's time.
  for (int r = 0; r < R; ++r) {
    for (int q = 0; q < kQ; ++q) acc[r][q] = V8{};
  }
  const int64_t kv = k / kW * kW;
  for (int64_t t = 0; t < kv; t += kW) {
    V8 av[R];
    for (int r = 0; r < R; ++r) av[r] = load8(a + r * lda + t);
    for (int q = 0; q < kQ; ++q) {
      const V8 bv = load8(b + q * ldb + t);
      for (int r = 0; r < R; ++r) acc[r][q] += av[r] * bv;
    }
  }
  for (int r = 0; r < R; ++r) {
    __m128 sums = lane_sums4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
    if (kv < k) {
      float tail[kQ] = {};
      for (int q = 0; q < kQ; ++q) {
        for (int64_t t = kv; t < k; ++t) tail[q] += a[r * lda + t] * b[q * ldb + t];
      }
      sums = _mm_add_ps(sums, _mm_loadu_ps(tail));
    }
    if (add) sums = _mm_add_ps(_mm_loadu_ps(c + r * ldc), sums);
    _mm_storeu_ps(c + r * ldc, sums);
  }
}

// One entry of c; four sets of accumulators hide the FMA latency of a single chain.
HSGD_AVX2 void nt_one(const float* a, const float* b, int64_t k, bool add, float& c) {
  constexpr int kU = 4;
  V8 acc[kU] = {};
  const int64_t kv = k / (kW * kU) * (kW * kU);
  for (int64_t t = 0; t < kv; t += kW * kU) {
    for (int u = 0; u < kU; ++u) acc[u] += load8(a + t + u * kW) * load8(b + t + u * kW);
  }
  float s = lane_sum((acc[0] + acc[1]) + (acc[2] + acc[3]));
  for (int64_t t = kv; t < k; ++t) s += a[t] * b[t];
  c = add ? c + s : s;
}

// c (m, n) (+)= a (m, k) * b (k, n).
__attribute__((target("avx2,fma"))) void nn(int64_t m, int64_t n, int64_t k, const float* a,
                                            int64_t lda, const float* b, int64_t ldb, float* c,
                                            int64_t ldc, bool add) {
  int64_t t = 0;
  for (; t + 2 * kW <= n; t += 2 * kW) nn_columns<2>(m, k, a, lda, b + t, ldb, c + t, ldc, add);
  if (t + kW <= n) {
    nn_columns<1>(m, k, a, lda, b + t, ldb, c + t, ldc, add);
    t += kW;
  }
  if (t == n) return;
  // The last n - t (< 8) columns go through zero-padded copies, so that no load or store leaves
  // the callers' matrices.
  const int64_t rest = n - t;
  auto b_pad = std::make_unique<float[]>(k * kW);
  auto c_pad = std::make_unique<float[]>(m * kW);
  for (int64_t i = 0; i < k; ++i) std::copy_n(b + i * ldb + t, rest, b_pad.get() + i * kW);
  if (add) {
    for (int64_t r = 0; r < m; ++r) std::copy_n(c + r * ldc + t, rest, c_pad.get() + r * kW);
  }
  nn_columns<1>(m, k, a, lda, b_pad.get(), kW, c_pad.get(), kW, add);
  for (int64_t r = 0; r < m; ++r) std::copy_n(c_pad.get() + r * kW, rest, c + r * ldc + t);
}

}  // namespace

void gemm_nn_avx2(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc) {
  nn(m, n, k, a, lda, b, ldb, c, ldc, false);
}

__attribute__((target("avx2,fma"))) void gemm_nt_avx2(int64_t m, int64_t n, int64_t k,
                                                      const float* a, int64_t lda, const float* b,
                                                      int64_t ldb, bool add, float* c,
                                                      int64_t ldc) {
  if (m > kLaneSumMaxRows) {
    // Larger outputs run faster as an nn product with b transposed (O(n k) copies against
    // O(m n k) multiply-adds). nn sums each entry in one lane, so k is cut into chunks whose
    // partial products are added together, keeping the rounding error near that of the
    // lane-wise sums.
    constexpr int64_t kChunk = 128;
    auto b_t = std::make_unique_for_overwrite<float[]>(kChunk * n);  // (chunk, n)
    auto part = std::make_unique_for_overwrite<float[]>(m * n);      // (m, n)
    for (int64_t t0 = 0; t0 < k; t0 += kChunk) {
      const int64_t len = std::min(kChunk, k - t0);
      for (int64_t q = 0; q < n; ++q) {
        for (int64_t t = 0; t < len; ++t) b_t[t * n + q] = b[q * ldb + t0 + t];
      }
      nn(m, n, len, a + t0, lda, b_t.get(), n, part.get(), n, false);
      for (int64_t r = 0; r < m; ++r) {
        float* out = c + r * ldc;
        const float* p = part.get() + r * n;
        if (t0 == 0 && !add) {
          std::copy_n(p, n, out);
        } else {
          for (int64_t q = 0; q < n; ++q) out[q] += p[q];
        }
      }
    }
    return;
  }
  constexpr int kRows = 3, kCols = 4;
  const int64_t n_blocked = n / kCols * kCols;
  int64_t r = 0;
  for (; r + kRows <= m; r += kRows) {
    for (int64_t q = 0; q < n_blocked; q += kCols) {
      nt_block4<kRows>(a + r * lda, lda, b + q * ldb, ldb, k, add, c + r * ldc + q, ldc);
    }
  }
  for (; r < m; ++r) {
    for (int64_t q = 0; q < n_blocked; q += kCols) {
      nt_block4<1>(a + r * lda, lda, b + q * ldb, ldb, k, add, c + r * ldc + q, ldc);
    }
  }
  for (r = 0; r < m; ++r) {
    for (int64_t q = n_blocked; q < n; ++q) nt_one(a + r * lda, b + q * ldb, k, add, c[r * ldc + q]);
  }
}

}  // namespace hsgd::kernels::detail
