#include "framework/kernels/conv_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <memory>

#include "comm/error.h"
#include "framework/kernels/conv_gemm_avx2.h"

namespace hsgd::kernels {
namespace {

using simd::kLanes;
using simd::load;
using simd::Mask;
using simd::store;
using simd::Vec;

// ---- nn: c = a * b with n large ----
// Blocks of 8 rows by 32 columns of c are 16 accumulators; every step reads two vectors of a row
// of b and broadcasts one entry of a per row of the block.

constexpr int kRows = 8;
constexpr int64_t kColumns = 2 * kLanes;

// Rows [0, R) x columns [0, kColumns) of c.
template <int R>
HSGD_INLINE void nn_block(const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                          int64_t ldc, int64_t k) {
  Vec acc[R][2] = {};
  for (int64_t i = 0; i < k; ++i) {
    Vec b0, b1;
    load(b0, b + i * ldb);
    load(b1, b + i * ldb + kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float s = a[r * lda + i];
      acc[r][0] += s * b0;
      acc[r][1] += s * b1;
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    store(c + r * ldc, acc[r][0]);
    store(c + r * ldc + kLanes, acc[r][1]);
  }
}

// All m rows x columns [0, kColumns) of c.
HSGD_INLINE void nn_columns(int64_t m, int64_t k, const float* a, int64_t lda, const float* b,
                            int64_t ldb, float* c, int64_t ldc) {
  int64_t r = 0;
  for (; r + kRows <= m; r += kRows) nn_block<kRows>(a + r * lda, lda, b, ldb, c + r * ldc, ldc, k);
  for (; r < m; ++r) nn_block<1>(a + r * lda, lda, b, ldb, c + r * ldc, ldc, k);
}

HSGD_INLINE void nn_kernel(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                           const float* b, int64_t ldb, float* c, int64_t ldc) {
  int64_t t = 0;
  for (; t + kColumns <= n; t += kColumns) nn_columns(m, k, a, lda, b + t, ldb, c + t, ldc);
  if (t == n) return;
  // The last n - t columns go through zero-padded copies, so that no load or store leaves the
  // callers' matrices.
  const int64_t rest = n - t;
  auto b_pad = std::make_unique<float[]>(k * kColumns);
  auto c_pad = std::make_unique_for_overwrite<float[]>(m * kColumns);
  for (int64_t i = 0; i < k; ++i) std::copy_n(b + i * ldb + t, rest, b_pad.get() + i * kColumns);
  nn_columns(m, k, a, lda, b_pad.get(), kColumns, c_pad.get(), kColumns);
  for (int64_t r = 0; r < m; ++r) std::copy_n(c_pad.get() + r * kColumns, rest, c + r * ldc + t);
}

__attribute__((target("avx512f,avx2,fma"))) void nn_avx512(int64_t m, int64_t n, int64_t k,
                                                           const float* a, int64_t lda,
                                                           const float* b, int64_t ldb, float* c,
                                                           int64_t ldc) {
  nn_kernel(m, n, k, a, lda, b, ldb, c, ldc);
}

// ---- nt: c = a * b^T (+ c) with k large ----
// Blocks of 4 x 4 entries of c keep one lane-wise partial sum each over k, reduced to 16 scalars
// at the end; k % 16 trailing products are added in scalar.

constexpr int kBlock = 4;

// out[i] = sum over the lanes of x[i], for 16 vectors. Each level adds the two halves of pairs
// of vectors, halving the lanes per sum and keeping the order.
HSGD_INLINE void reduce16(Vec* x, Vec& out) {
  constexpr Mask kLo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  constexpr Mask kHi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  constexpr Mask kLo4 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
  constexpr Mask kHi4 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
  constexpr Mask kLo2 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
  constexpr Mask kHi2 = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
  constexpr Mask kLo1 = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  constexpr Mask kHi1 = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  for (int i = 0; i < 8; ++i) {
    x[i] = __builtin_shuffle(x[2 * i], x[2 * i + 1], kLo8) +
           __builtin_shuffle(x[2 * i], x[2 * i + 1], kHi8);
  }
  for (int i = 0; i < 4; ++i) {
    x[i] = __builtin_shuffle(x[2 * i], x[2 * i + 1], kLo4) +
           __builtin_shuffle(x[2 * i], x[2 * i + 1], kHi4);
  }
  for (int i = 0; i < 2; ++i) {
    x[i] = __builtin_shuffle(x[2 * i], x[2 * i + 1], kLo2) +
           __builtin_shuffle(x[2 * i], x[2 * i + 1], kHi2);
  }
  out = __builtin_shuffle(x[0], x[1], kLo1) + __builtin_shuffle(x[0], x[1], kHi1);
}

// The kBlock x kBlock block of c at a's and b's first rows.
HSGD_INLINE void nt_block(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k,
                          bool add, float* c, int64_t ldc) {
  Vec acc[kBlock * kBlock] = {};
  const int64_t kv = k / kLanes * kLanes;
  for (int64_t t = 0; t < kv; t += kLanes) {
    Vec av[kBlock], bv[kBlock];
    for (int r = 0; r < kBlock; ++r) {
      load(av[r], a + r * lda + t);
      load(bv[r], b + r * ldb + t);
    }
#pragma GCC unroll 16
    for (int i = 0; i < kBlock * kBlock; ++i) acc[i] += av[i / kBlock] * bv[i % kBlock];
  }
  Vec sums;
  reduce16(acc, sums);
  for (int i = 0; i < kBlock * kBlock; ++i) {
    const int r = i / kBlock, q = i % kBlock;
    float s = sums[i];
    for (int64_t t = kv; t < k; ++t) s += a[r * lda + t] * b[q * ldb + t];
    float& out = c[r * ldc + q];
    out = add ? out + s : s;
  }
}

// One entry of c.
HSGD_INLINE void nt_one(const float* a, const float* b, int64_t k, bool add, float& c) {
  Vec acc = {};
  const int64_t kv = k / kLanes * kLanes;
  for (int64_t t = 0; t < kv; t += kLanes) {
    Vec av, bv;
    load(av, a + t);
    load(bv, b + t);
    acc += av * bv;
  }
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  for (int64_t t = kv; t < k; ++t) s += a[t] * b[t];
  c = add ? c + s : s;
}

HSGD_INLINE void nt_kernel(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                           const float* b, int64_t ldb, bool add, float* c, int64_t ldc) {
  const int64_t m_blocked = m / kBlock * kBlock, n_blocked = n / kBlock * kBlock;
  for (int64_t r = 0; r < m_blocked; r += kBlock) {
    for (int64_t q = 0; q < n_blocked; q += kBlock) {
      nt_block(a + r * lda, lda, b + q * ldb, ldb, k, add, c + r * ldc + q, ldc);
    }
  }
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t q = r < m_blocked ? n_blocked : 0; q < n; ++q) {
      nt_one(a + r * lda, b + q * ldb, k, add, c[r * ldc + q]);
    }
  }
}

__attribute__((target("avx512f,avx2,fma"))) void nt_avx512(int64_t m, int64_t n, int64_t k,
                                                           const float* a, int64_t lda,
                                                           const float* b, int64_t ldb, bool add,
                                                           float* c, int64_t ldc) {
  nt_kernel(m, n, k, a, lda, b, ldb, add, c, ldc);
}

}  // namespace

void conv_gemm_nn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc, simd::Isa isa) {
  HSGD_CHECK(simd::isa_supported(isa), "conv_gemm_nn: this CPU cannot run ", simd::isa_name(isa),
             " code");
  if (isa == simd::Isa::kAvx512) {
    nn_avx512(m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
  if (isa == simd::Isa::kAvx2) {
    detail::gemm_nn_avx2(m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c,
              ldc);
}

void conv_gemm_nt(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float beta, float* c, int64_t ldc, simd::Isa isa) {
  HSGD_CHECK(simd::isa_supported(isa), "conv_gemm_nt: this CPU cannot run ", simd::isa_name(isa),
             " code");
  if (isa == simd::Isa::kAvx512) {
    nt_avx512(m, n, k, a, lda, b, ldb, beta != 0.0f, c, ldc);
    return;
  }
  if (isa == simd::Isa::kAvx2) {
    detail::gemm_nt_avx2(m, n, k, a, lda, b, ldb, beta != 0.0f, c, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace hsgd::kernels
