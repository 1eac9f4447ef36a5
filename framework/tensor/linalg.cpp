// matmul and linear on OpenBLAS sgemm. A 2-D operand that is a transposed view of row-major
// memory is handed to sgemm with CblasTrans and its leading dimension instead of being copied,
// so the backward passes (g @ w, g^T @ x, ...) cost no transposition copies.

#include <cblas.h>

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/parallel/parallel.h"
#include "framework/tensor/ops.h"
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

// out (M,N) = a (M,K) @ b (K,N) + beta * out; out is contiguous. a and b are 2-D, any strides.
void gemm_2d(const Tensor& a, const Tensor& b, float* out, float beta) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m * n; ++i) out[i] = beta == 0.0f ? 0.0f : beta * out[i];
    return;
  }
  // The first product must already run at hsgd's thread count (HSGD_NUM_THREADS), which the pool
  // gives OpenBLAS when it first decides it.
  static const int threads_decided = get_num_threads();
  (void)threads_decided;
  Tensor ac = a, bc = b;
  GemmOperand oa{}, ob{};
  if (!describe(a.data(), m, k, a.strides()[0], a.strides()[1], oa)) {
    ac = a.detach().contiguous();
    describe(ac.data(), m, k, k, 1, oa);
  }
  if (!describe(b.data(), k, n, b.strides()[0], b.strides()[1], ob)) {
    bc = b.detach().contiguous();
    describe(bc.data(), k, n, n, 1, ob);
  }
  cblas_sgemm(CblasRowMajor, oa.trans, ob.trans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, oa.data, oa.ld, ob.data, ob.ld, beta, out,
              static_cast<int>(n));
}

// The forward of matmul without autograd.
Tensor matmul_forward(const Tensor& a, const Tensor& b) {
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  const int64_t k = sa.back();
  const int64_t kb = sb.size() == 1 ? sb[0] : sb[sb.size() - 2];
  HSGD_CHECK(k == kb, "matmul: inner dimensions differ: ", shape_str(sa), " @ ", shape_str(sb),
             " (", k, " vs ", kb, ")");
  if (sb.size() == 2) {
    // (..., M, K) @ (K, N): one gemm over all leading rows when they are contiguous.
    const Tensor a2 = a.dim() == 2 ? a : a.detach().reshape({-1, k});
    Shape out_shape(sa.begin(), sa.end() - 1);
    out_shape.push_back(sb[1]);
    Tensor out = empty(out_shape);
    gemm_2d(a2, b, out.data(), 0.0f);
    return out;
  }
  // Batched: equal batch dims.
  HSGD_CHECK(sa.size() == sb.size() && std::equal(sa.begin(), sa.end() - 2, sb.begin()),
             "matmul: batch dimensions must be equal, got ", shape_str(sa), " @ ", shape_str(sb));
  const int64_t m = sa[sa.size() - 2], n = sb.back();
  const Tensor a3 = a.detach().reshape({-1, m, k});
  const Tensor b3 = b.detach().reshape({-1, k, n});
  Shape out_shape(sa.begin(), sa.end() - 1);
  out_shape.push_back(n);
  Tensor out = empty(out_shape);
  for (int64_t i = 0; i < a3.size(0); ++i) {
    gemm_2d(a3.narrow(0, i, 1).squeeze(0), b3.narrow(0, i, 1).squeeze(0), out.data() + i * m * n,
            0.0f);
  }
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  HSGD_CHECK(a.defined() && b.defined(), "matmul: an input is undefined");
  HSGD_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: inputs must be at least 1-D, got ",
             shape_str(a.shape()), " @ ", shape_str(b.shape()));
  // Vectors as in torch: a 1-D a is a row vector, a 1-D b a column vector; the dim is removed.
  if (a.dim() == 1) return matmul(a.unsqueeze(0), b).squeeze(-2);
  if (b.dim() == 1) return matmul(a, b.unsqueeze(1)).squeeze(-1);
  HSGD_CHECK(b.dim() == 2 || b.dim() == a.dim(), "matmul: unsupported shapes ",
             shape_str(a.shape()), " @ ", shape_str(b.shape()),
             " (b must be 2-D or have a's batch dimensions)");
  Tensor out = matmul_forward(a, b);
  if (autograd::needs_grad({a, b})) {
    autograd::record(
        out, "MatmulBackward", {a, b},
        [a = a.detach(), b = b.detach()](const Tensor& g, const NeedsGrad& n) {
          std::vector<Tensor> grads(2);
          // g is (...,M,N): da = g @ b^T, db = a^T @ g.
          if (n[0]) grads[0] = matmul_forward(g, b.transpose(-1, -2));
          if (n[1]) {
            if (b.dim() == 2 && a.dim() > 2) {
              const int64_t k = a.size(-1);
              grads[1] = matmul_forward(a.reshape({-1, k}).t(), g.reshape({-1, g.size(-1)}));
            } else {
              grads[1] = matmul_forward(a.transpose(-1, -2), g);
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
