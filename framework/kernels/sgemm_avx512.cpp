// The AVX-512 macro-kernel of hsgd's SGEMM (sgemm_blocked.h): micro-tiles of kMr rows by two
// 16-float registers of c (28 accumulators of the 32 registers), each step of k loading two
// vectors of a row of op(b) and broadcasting one entry of op(a) per row (packed or in place).
// Columns past the block's edge are masked, so no load or store leaves the caller's b or c.

#include <immintrin.h>

#include <algorithm>

#include "framework/kernels/sgemm_blocked.h"

namespace hsgd::kernels::detail {
namespace {

#define HSGD_AVX512 __attribute__((target("avx512f,avx2,fma")))
#define HSGD_AVX512_INLINE [[gnu::always_inline]] inline HSGD_AVX512

constexpr int kLanes = 16;
constexpr int kVecs = 2;  // registers per row of the micro-tile
constexpr int kMr = 14, kNr = kVecs * kLanes;

// Rows [0, R) of the micro-tile at c: c = alpha * a b + beta * c over kc steps. Row r of a is at
// a + r and step p at + p * a_stride when RowUnit, else at a + r * a_stride + p; step p of b is at
// b + p * b_step. When Masked, only the lanes set in mask[v] of register v exist.
template <int R, bool Masked, bool RowUnit>
HSGD_AVX512 void tile(int64_t kc, const float* a, int64_t a_stride, const float* b, int64_t b_step,
                      float alpha, float beta, float* c, int64_t ldc, const __mmask16* mask) {
  __m512 acc[R][kVecs];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + kNr - 1), _MM_HINT_T0);
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < kc; ++p) {
    __m512 bv[kVecs];
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v)
      bv[v] =
          Masked ? _mm512_maskz_loadu_ps(mask[v], b + v * kLanes) : _mm512_loadu_ps(b + v * kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(RowUnit ? a[r] : a[r * a_stride]);
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
    a += RowUnit ? a_stride : 1;
    b += b_step;
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      float* out = c + r * ldc + v * kLanes;
      __m512 x = _mm512_mul_ps(acc[r][v], va);
      if (beta != 0.0f) {
        const __m512 old = Masked ? _mm512_maskz_loadu_ps(mask[v], out) : _mm512_loadu_ps(out);
        x = _mm512_fmadd_ps(old, vb, x);
      }
      if (Masked) {
        _mm512_mask_storeu_ps(out, mask[v], x);
      } else {
        _mm512_storeu_ps(out, x);
      }
    }
  }
}

// tile<rows, Masked, RowUnit> for rows in [1, R].
template <int R, bool Masked, bool RowUnit>
HSGD_AVX512_INLINE void tile_rows(int rows, int64_t kc, const float* a, int64_t a_stride,
                                  const float* b, int64_t b_step, float alpha, float beta, float* c,
                                  int64_t ldc, const __mmask16* mask) {
  if constexpr (R > 1) {
    if (rows < R)
      return tile_rows<R - 1, Masked, RowUnit>(rows, kc, a, a_stride, b, b_step, alpha, beta, c,
                                               ldc, mask);
  }
  tile<R, Masked, RowUnit>(kc, a, a_stride, b, b_step, alpha, beta, c, ldc, mask);
}

// The micro-tile of `rows` rows at c, masked unless full.
template <bool RowUnit>
HSGD_AVX512_INLINE void tile_block(int rows, bool full, int64_t kc, const float* a,
                                   int64_t a_stride, const float* b, int64_t b_step, float alpha,
                                   float beta, float* c, int64_t ldc, const __mmask16* mask) {
  if (full) {
    tile_rows<kMr, false, RowUnit>(rows, kc, a, a_stride, b, b_step, alpha, beta, c, ldc, mask);
  } else {
    tile_rows<kMr, true, RowUnit>(rows, kc, a, a_stride, b, b_step, alpha, beta, c, ldc, mask);
  }
}

HSGD_AVX512 void macro(int64_t mc, int64_t nc, int64_t kc, const ABlock& ab, const BBlock& bb,
                       float alpha, float beta, float* c, int64_t ldc) {
  for (int64_t j = 0; j < nc; j += kNr) {
    const int64_t cols = std::min<int64_t>(kNr, nc - j);
    __mmask16 mask[kVecs];
    for (int v = 0; v < kVecs; ++v) {
      const int64_t lanes = std::clamp<int64_t>(cols - v * kLanes, 0, kLanes);
      mask[v] = static_cast<__mmask16>((1u << lanes) - 1u);
    }
    const float* b = bb.data + j * bb.panel_scale;
    for (int64_t i = 0; i < mc; i += kMr) {
      const int rows = static_cast<int>(std::min<int64_t>(kMr, mc - i));
      const float* a = ab.data + i * ab.tile_scale;
      float* ct = c + i * ldc + j;
      if (ab.row == 1) {
        tile_block<true>(rows, cols == kNr, kc, a, ab.step, b, bb.step, alpha, beta, ct, ldc, mask);
      } else {
        tile_block<false>(rows, cols == kNr, kc, a, ab.row, b, bb.step, alpha, beta, ct, ldc, mask);
      }
    }
  }
}

}  // namespace

const GemmKernel& sgemm_kernel_avx512() {
  static const GemmKernel kernel{
      .mr = kMr, .nr = kNr, .mc = 12 * kMr, .kc = 256, .nc = 128 * kNr, .macro = macro};
  return kernel;
}

}  // namespace hsgd::kernels::detail
