// matmul (with broadcast batch dims) and linear on kernels::sgemm. A matrix that is a transposed
// view of row-major memory is handed to sgemm with CblasTrans and its leading dimension instead
// of being copied, so the backward passes (g @ w, g^T @ x, ...) cost no transposition copies.

#include <cblas.h>

#include <algorithm>
#include <vector>

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/kernels/sgemm.h"
#include "framework/tensor/ops.h"
#include "framework/tensor/strided_loop.h"
#include "framework/tensor/tensor_impl.h"

namespace hsgd {

using autograd::NeedsGrad;

namespace {

// How sgemm should read a (rows, cols) matrix at `data` with the given element strides.
struct GemmOperand {
  const float* data;
  CBLAS_TRANSPOSE trans;
  int ld;
};

// Returns false when the strides fit neither layout (the caller copies to contiguous).
bool describe(const float* data, int64_t rows, int64_t cols, int64_t s0, int64_t s1,
              GemmOperand& op) {
  // Row-major: element (i,j) at i*ld + j, ld >= cols.
  if ((cols == 1 || s1 == 1) && (rows == 1 || s0 >= std::max<int64_t>(cols, 1))) {
    op = {data, CblasNoTrans, static_cast<int>(rows == 1 ? std::max<int64_t>(cols, 1) : s0)};
    return true;
  }
  // Transposed: element (i,j) at j*ld + i, ld >= rows.
  if ((rows == 1 || s0 == 1) && (cols == 1 || s1 >= std::max<int64_t>(rows, 1))) {
    op = {data, CblasTrans, static_cast<int>(cols == 1 ? std::max<int64_t>(rows, 1) : s1)};
    return true;
  }
  return false;
}

// A (rows, cols) matrix in memory: element (i, j) at data[i * s0 + j * s1].
struct Matrix {
  const float* data;
  int64_t rows, cols, s0, s1;
};

// out (M,N) = a (M,K) @ b (K,N) + beta * out; out is contiguous. Returns false, computing
// nothing, when the strides of a or b fit no sgemm layout.
bool try_gemm(const Matrix& a, const Matrix& b, float* out, float beta) {
  const int64_t m = a.rows, k = a.cols, n = b.cols;
  GemmOperand oa{}, ob{};
  if (!describe(a.data, m, k, a.s0, a.s1, oa) || !describe(b.data, k, n, b.s0, b.s1, ob)) {
    return false;
  }
  kernels::sgemm(oa.trans == CblasTrans, ob.trans == CblasTrans, m, n, k, 1.0f, oa.data, oa.ld,
                 ob.data, ob.ld, beta, out, n);
  return true;
}

// try_gemm for operands whose layout is known to fit (gemm_ready ones).
void gemm(const Matrix& a, const Matrix& b, float* out, float beta) {
  const bool done = try_gemm(a, b, out, beta);
  HSGD_CHECK_AS(Error, done, "matmul: operand strides fit no sgemm layout");
}

// t when sgemm can read its last two dims as they are, else a contiguous copy.
Tensor gemm_ready(const Tensor& t) {
  const int64_t d = t.dim();
  GemmOperand op{};
  if (describe(t.data(), t.size(-2), t.size(-1), t.strides()[d - 2], t.strides()[d - 1], op)) {
    return t;
  }
  return t.detach().contiguous();
}

Matrix matrix_of(const Tensor& t) {
  return Matrix{t.data(), t.size(0), t.size(1), t.strides()[0], t.strides()[1]};
}

// out (M,N) = a (M,K) @ b (K,N) + beta * out; out is contiguous. a and b are 2-D, any strides
// (an operand no sgemm layout fits is copied to contiguous first).
void gemm_2d(const Tensor& a, const Tensor& b, float* out, float beta) {
  if (try_gemm(matrix_of(a), matrix_of(b), out, beta)) return;
  gemm(matrix_of(gemm_ready(a)), matrix_of(gemm_ready(b)), out, beta);
}

// The batch dims of t: all but the last two.
Shape batch_shape(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

// out (O...,M,N) = a (A...,M,K) @ b (B...,K,N) over the broadcast batch F = broadcast(A, B), with
// the products that fall on one slot of O added up: O must broadcast to F, and every index of F
// maps to the slot of O that broadcasting reads. O = F is the batched product; a smaller O is
// the gradient of an operand that was broadcast, reduced without materialising the F-sized
// product (sgemm accumulates into the slot with beta = 1).
Tensor batched_matmul(const Tensor& a_in, const Tensor& b_in, const Shape& out_batch) {
  const Tensor a = gemm_ready(a_in), b = gemm_ready(b_in);
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const Shape batch_a = batch_shape(a), batch_b = batch_shape(b);
  const Shape full = broadcast_shapes(batch_a, batch_b);
  Shape out_shape = out_batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor out = empty(out_shape);
  const std::vector<int64_t> stride_a = detail::broadcast_strides(
      batch_a, std::vector<int64_t>(a.strides().begin(), a.strides().end() - 2), full);
  const std::vector<int64_t> stride_b = detail::broadcast_strides(
      batch_b, std::vector<int64_t>(b.strides().begin(), b.strides().end() - 2), full);
  const std::vector<int64_t> stride_out = detail::broadcast_strides(
      out_batch, std::vector<int64_t>(out.strides().begin(), out.strides().end() - 2), full);
  const int64_t da = a.dim(), db = b.dim();
  std::vector<bool> written(static_cast<size_t>(shape_numel(out_batch)), false);
  std::vector<int64_t> index(full.size(), 0);
  for (int64_t linear = 0; linear < shape_numel(full); ++linear) {
    int64_t oa = 0, ob = 0, oo = 0;
    for (size_t d = 0; d < full.size(); ++d) {
      oa += index[d] * stride_a[d];
      ob += index[d] * stride_b[d];
      oo += index[d] * stride_out[d];
    }
    const int64_t slot = m * n == 0 ? 0 : oo / (m * n);
    gemm(Matrix{a.data() + oa, m, k, a.strides()[da - 2], a.strides()[da - 1]},
         Matrix{b.data() + ob, k, n, b.strides()[db - 2], b.strides()[db - 1]}, out.data() + oo,
         written[slot] ? 1.0f : 0.0f);
    written[slot] = true;
    // Advance the batch index, last dim fastest.
    for (size_t d = full.size(); d-- > 0;) {
      if (++index[d] < full[d]) break;
      index[d] = 0;
    }
  }
  // Slots no product reached (F has an empty dim) hold the empty sum.
  for (size_t slot = 0; slot < written.size(); ++slot) {
    if (!written[slot]) std::fill_n(out.data() + slot * m * n, m * n, 0.0f);
  }
  return out;
}

// The forward of matmul without autograd; a and b are at least 2-D.
Tensor matmul_forward(const Tensor& a, const Tensor& b) {
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  const int64_t k = sa.back();
  HSGD_CHECK(k == sb[sb.size() - 2], "matmul: inner dimensions differ: ", shape_str(sa), " @ ",
             shape_str(sb), " (", k, " vs ", sb[sb.size() - 2], ")");
  if (sb.size() == 2) {
    // (..., M, K) @ (K, N): one gemm over all leading rows.
    const Tensor a2 = a.dim() == 2 ? a : a.detach().reshape({-1, k});
    Shape out_shape(sa.begin(), sa.end() - 1);
    out_shape.push_back(sb[1]);
    Tensor out = empty(out_shape);
    gemm_2d(a2, b, out.data(), 0.0f);
    return out;
  }
  return batched_matmul(a, b, broadcast_shapes(batch_shape(a), batch_shape(b)));
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  HSGD_CHECK(a.defined() && b.defined(), "matmul: an input is undefined");
  HSGD_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: inputs must be at least 1-D, got ",
             shape_str(a.shape()), " @ ", shape_str(b.shape()));
  const int64_t ka = a.size(-1), kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  HSGD_CHECK(ka == kb, "matmul: inner dimensions differ: ", shape_str(a.shape()), " @ ",
             shape_str(b.shape()), " (", ka, " vs ", kb, ")");
  // Vectors as in torch: a 1-D a is a row vector, a 1-D b a column vector; the dim is removed.
  if (a.dim() == 1 && b.dim() == 1) return matmul(a.unsqueeze(0), b.unsqueeze(1)).reshape({});
  if (a.dim() == 1) return matmul(a.unsqueeze(0), b).squeeze(-2);
  if (b.dim() == 1) return matmul(a, b.unsqueeze(1)).squeeze(-1);
  const Shape batch_a = batch_shape(a), batch_b = batch_shape(b);
  for (size_t i = 1; i <= std::min(batch_a.size(), batch_b.size()); ++i) {
    const int64_t x = batch_a[batch_a.size() - i], y = batch_b[batch_b.size() - i];
    HSGD_CHECK(x == y || x == 1 || y == 1, "matmul: batch dimensions ", shape_str(batch_a), " and ",
               shape_str(batch_b), " of ", shape_str(a.shape()), " @ ", shape_str(b.shape()),
               " do not broadcast (", x, " vs ", y, ")");
  }
  Tensor out = matmul_forward(a, b);
  if (autograd::needs_grad({a, b})) {
    autograd::record(
        out, "MatmulBackward", {a, b},
        [a = a.detach(), b = b.detach(), batch_a, batch_b](const Tensor& g, const NeedsGrad& n) {
          std::vector<Tensor> grads(2);
          // g is (F...,M,N): da = g @ b^T, db = a^T @ g, each summed over the batch dims that
          // broadcasting expanded for it.
          if (n[0]) {
            grads[0] = b.dim() == 2 ? matmul_forward(g, b.t())
                                    : batched_matmul(g, b.transpose(-1, -2), batch_a);
          }
          if (n[1]) {
            if (b.dim() == 2 && a.dim() > 2) {
              // (K, F*M) @ (F*M, N): the batch folds into the inner dimension of one gemm.
              const int64_t k = a.size(-1);
              grads[1] = matmul_forward(a.reshape({-1, k}).t(), g.reshape({-1, g.size(-1)}));
            } else {
              grads[1] = batched_matmul(a.transpose(-1, -2), g, batch_b);
            }
          }
          return grads;
        });
  }
  return out;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  HSGD_CHECK(x.defined() && w.defined(), "linear: input or weight is undefined");
  HSGD_CHECK(w.dim() == 2, "linear: weight must be 2-D (out, in), got ", shape_str(w.shape()));
  HSGD_CHECK(x.dim() >= 1, "linear: input must be at least 1-D, got ", shape_str(x.shape()));
  const int64_t in = w.size(1), out_features = w.size(0);
  HSGD_CHECK(x.size(-1) == in, "linear: input features ", x.size(-1), " (input shape ",
             shape_str(x.shape()), ") must equal weight in_features ", in, " (weight shape ",
             shape_str(w.shape()), ")");
  if (b.defined()) {
    HSGD_CHECK(b.dim() == 1 && b.size(0) == out_features, "linear: bias must be (", out_features,
               "), got ", shape_str(b.shape()));
  }
  const Tensor x2 = x.detach().reshape({-1, in});  // (N,in)
  const int64_t n = x2.size(0);
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(out_features);
  Tensor out = empty(out_shape);  // (N,out)
  float beta = 0.0f;
  if (b.defined() && n > 0) {
    const Tensor bc = b.detach().contiguous();
    for (int64_t i = 0; i < n; ++i) {
      std::copy(bc.data(), bc.data() + out_features, out.data() + i * out_features);
    }
    beta = 1.0f;
  }
  gemm_2d(x2, w.detach().t(), out.data(), beta);
  if (autograd::needs_grad({x, w, b})) {
    autograd::record(out, "LinearBackward", {x, w, b},
                     [x2, w = w.detach(), xs = x.shape()](const Tensor& g, const NeedsGrad& need) {
                       std::vector<Tensor> grads(3);
                       const Tensor g2 = g.reshape({-1, g.size(-1)});  // (N,out)
                       if (need[0])
                         grads[0] = matmul_forward(g2, w).reshape(xs);      // (N,out) @ (out,in)
                       if (need[1]) grads[1] = matmul_forward(g2.t(), x2);  // (out,N) @ (N,in)
                       if (need[2]) grads[2] = sum(g2, 0);
                       return grads;
                     });
  }
  return out;
}

}  // namespace hsgd
