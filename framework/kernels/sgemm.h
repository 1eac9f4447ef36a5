#pragma once
// The one call into OpenBLAS's cblas_sgemm for tensor ops (matmul, linear, attention), with
// cblas_sgemm's meaning of the arguments: row-major, leading dimensions are row strides.
//
// Beyond cblas_sgemm it guarantees: k == 0 gives c = beta * c (c not read when beta is 0), and
// m == 0 or n == 0 does nothing, where some OpenBLAS builds reject such sizes; and the first call
// runs at hsgd's thread count (framework/parallel/parallel.h), which the pool hands OpenBLAS when
// it first decides it.
//
// Usage:
//   float a[2 * 3] = {1, 2, 3, 4, 5, 6}, b[4 * 3] = {}, c[2 * 4];
//   // c (2,4) = a (2,3) @ b (4,3)^T
//   kernels::sgemm(false, true, 2, 4, 3, 1.0f, a, 3, b, 3, 0.0f, c, 4);

#include <cstdint>

namespace hsgd::kernels {

// c (m,n) = alpha * op(a) op(b) + beta * c, op(x) = x^T when trans_x; op(a) is (m,k), op(b)
// (k,n). Sizes and leading dimensions must fit in int (cblas's types).
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace hsgd::kernels
