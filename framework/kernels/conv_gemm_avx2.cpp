#include "framework/kernels/conv_gemm_avx2.h"

#include <algorithm>
#include <cstring>
#include <memory>

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

// ---- nt: blocks of 2 x 4 entries of c, each a lane-wise partial sum over k ----

HSGD_AVX2 float lane_sum(V8 x) {
  float l[kW];
  std::memcpy(l, &x, sizeof(V8));
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// U independent sets of accumulators hide the FMA latency when the block is small (1 x 1: one
// chain would wait 4 cycles per step).
template <int RB, int QB, int U = 1>
HSGD_AVX2 void nt_block(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k,
                        bool add, float* c, int64_t ldc) {
  V8 acc[U][RB][QB] = {};
  const int64_t kv = k / (kW * U) * (kW * U);
  for (int64_t t = 0; t < kv; t += kW * U) {
    for (int u = 0; u < U; ++u) {
      V8 av[RB], bv[QB];
      for (int r = 0; r < RB; ++r) av[r] = load8(a + r * lda + t + u * kW);
      for (int q = 0; q < QB; ++q) bv[q] = load8(b + q * ldb + t + u * kW);
      for (int r = 0; r < RB; ++r) {
        for (int q = 0; q < QB; ++q) acc[u][r][q] += av[r] * bv[q];
      }
    }
  }
  for (int r = 0; r < RB; ++r) {
    for (int q = 0; q < QB; ++q) {
      V8 total = acc[0][r][q];
      for (int u = 1; u < U; ++u) total += acc[u][r][q];
      float s = lane_sum(total);
      for (int64_t t = kv; t < k; ++t) s += a[r * lda + t] * b[q * ldb + t];
      float& out = c[r * ldc + q];
      out = add ? out + s : s;
    }
  }
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
  if (m > 16) {
    // Larger outputs run faster as an nn product with b transposed (O(n k) copies against
    // O(m n k) multiply-adds): 2 x 4 lane-wise sums stay at about 35 GFLOP/s, nn at 60-70. nn
    // sums each entry in one lane, so k is cut into chunks whose partial products are added
    // together, keeping the rounding error near that of the lane-wise sums.
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
  constexpr int kRows = 2, kCols = 4;
  const int64_t m_blocked = m / kRows * kRows, n_blocked = n / kCols * kCols;
  for (int64_t r = 0; r < m_blocked; r += kRows) {
    for (int64_t q = 0; q < n_blocked; q += kCols) {
      nt_block<kRows, kCols>(a + r * lda, lda, b + q * ldb, ldb, k, add, c + r * ldc + q, ldc);
    }
  }
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t q = r < m_blocked ? n_blocked : 0; q < n; ++q) {
      nt_block<1, 1, 4>(a + r * lda, lda, b + q * ldb, ldb, k, add, c + r * ldc + q, ldc);
    }
  }
}

}  // namespace hsgd::kernels::detail
