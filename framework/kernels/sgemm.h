#pragma once
// Single-precision matrix product for tensor ops (matmul, linear, attention), with cblas_sgemm's
// meaning of the arguments: row-major, leading dimensions are row strides.
//
// The product runs on hsgd's own packed, cache-blocked kernels for the widest instruction set the
// CPU has (AVX-512, else AVX2 + FMA), chosen at run time: the build has no -march flags. A CPU
// with neither calls OpenBLAS's cblas_sgemm, as do products with a very narrow c (sgemm_path).
// sgemm_isa() says which instruction set sgemm uses; the overload taking a simd::Isa forces one
// (tests and benchmarks run every path the CPU supports). Results agree with cblas_sgemm to float
// rounding (the summation order differs); on hsgd's kernels the same call gives the same bits on
// every run and at every thread count.
//
// Beyond cblas_sgemm it guarantees: k == 0 or alpha == 0 gives c = beta * c without reading a or
// b; c is never read when beta is 0 (NaNs there do not propagate); m == 0 or n == 0 does nothing;
// nothing outside the m x n entries of c (row stride ldc) is written, and nothing outside the
// operands' m x k and k x n entries is read. Large products split their rows (or columns) across
// framework/parallel's pool, so they run at hsgd's thread count; called from inside a
// parallel_for chunk they run on the calling thread.
//
// Usage:
//   float a[2 * 3] = {1, 2, 3, 4, 5, 6}, b[4 * 3] = {}, c[2 * 4];
//   // c (2,4) = a (2,3) @ b (4,3)^T
//   kernels::sgemm(false, true, 2, 4, 3, 1.0f, a, 3, b, 3, 0.0f, c, 4);

#include <cstdint>

#include "framework/kernels/conv_simd.h"

namespace hsgd::kernels {

// c (m,n) = alpha * op(a) op(b) + beta * c, op(x) = x^T when trans_x; op(a) is (m,k), op(b)
// (k,n). Sizes and leading dimensions must fit in int (cblas's types).
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// As above on isa's kernels: kAvx512 or kAvx2 for hsgd's own, kBaseline for OpenBLAS. Throws
// hsgd::InvalidArgument naming isa when the CPU cannot run it.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
           simd::Isa isa);

// The instruction set the first overload uses on this CPU: the widest it supports (kBaseline
// meaning OpenBLAS).
simd::Isa sgemm_isa();

// The path sgemm(..., isa) takes for a product with m rows and n columns: isa, or kBaseline
// (OpenBLAS) when c is narrower than half of isa's micro-tile (n < 16 on AVX-512, n < 8 on AVX2)
// and taller than wide, where OpenBLAS was measured faster.
simd::Isa sgemm_path(int64_t m, int64_t n, simd::Isa isa);

}  // namespace hsgd::kernels
