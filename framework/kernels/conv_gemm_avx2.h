#pragma once
// AVX2 + FMA kernels of conv_gemm.h, written on native 8-float vectors. (The 16-float Vec of
// conv_simd.h is one register on AVX-512, but GCC lowers it for AVX2 through the stack, which ran
// these products at 5-7 GFLOP/s.) For conv_gemm.cpp only; the CPU must support AVX2 and FMA.

#include <cstdint>

namespace hsgd::kernels::detail {

// c (m, n) = a (m, k) * b (k, n), as conv_gemm_nn.
void gemm_nn_avx2(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc);

// c (m, n) = a (m, k) * b (n, k)^T (+ c when add), as conv_gemm_nt.
void gemm_nt_avx2(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, bool add, float* c, int64_t ldc);

}  // namespace hsgd::kernels::detail
