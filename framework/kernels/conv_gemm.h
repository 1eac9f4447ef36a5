#pragma once
// Single-precision matrix products of the conv kernels, row-major, with cblas_sgemm's meaning
// of the arguments (leading dimensions are row strides).
//
// The conv operands are small in one or two dimensions (16 to 64 channels, or the 16 Winograd
// positions), where OpenBLAS spends much of its time packing them. On AVX-512 CPUs these run
// register-blocked kernels that read the operands in place; elsewhere they call cblas_sgemm.
// Results agree with cblas_sgemm to float rounding (the summation order differs). isa selects
// the implementation (tests pass each one the CPU supports); it must be supported by the CPU.

#include <cstdint>

#include "framework/kernels/conv_simd.h"

namespace hsgd::kernels {

// c (m, n) = a (m, k) * b (k, n), overwriting c. Best when n is large (tiles, pixels).
void conv_gemm_nn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc, simd::Isa isa = simd::conv_isa());

// c (m, n) = a (m, k) * b (n, k)^T + beta * c, beta 0 or 1 (c is not read when 0). Best when
// the inner dimension k is large and m, n small (a weight gradient summed over pixels).
void conv_gemm_nt(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float beta, float* c, int64_t ldc, simd::Isa isa = simd::conv_isa());

}  // namespace hsgd::kernels
