// scaled_dot_product_attention: forward and backward, one block of query rows at a time.
//
// Per batch-head, for each block of at most kRowBlock query rows [r0, r1):
//   forward:  s = q[r0:r1] k^T * scale                      (rows, cols) on sgemm
//             causal: s[i][j] = -inf for key j > query i
//             p = softmax(s) row by row; lse[i] = log sum_j exp(s[i][j]) is saved
//             out[r0:r1] = p v                               (rows, Dv) on sgemm
//   backward: delta[i] = sum_c gout[i][c] * out[i][c]
//             p = exp(q k^T * scale - lse) recomputed for the block (0 where masked)
//             gv += p^T gout[r0:r1];  dp = gout[r0:r1] v^T
//             ds = p * (dp - delta)
//             gq[r0:r1] = ds k * scale;  gk += ds^T q[r0:r1] * scale
// With is_causal, a block only needs the keys [0, min(S, r1)): the columns past the block's
// last row are masked for every row of it, so they are neither computed nor stored.

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/kernels/sgemm.h"
#include "framework/kernels/vec_math.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"

namespace hsgd {

using autograd::NeedsGrad;
using kernels::sgemm;

namespace {

// Query rows per block: the scores of a block are kRowBlock x S floats.
constexpr int64_t kRowBlock = 64;

// Sizes of one attention call, from q (N...,T,D), k (N...,S,D), v (N...,S,Dv).
struct AttentionDims {
  int64_t heads;  // N: the product of the leading dims
  int64_t t, s, d, dv;
  bool causal;
  float scale;

  // The keys a block ending (exclusive) at query row r1 needs.
  int64_t cols(int64_t r1) const { return causal ? std::min(s, r1) : s; }
};

// scores (rows, cols) of query rows [r0, r0 + rows) against keys [0, cols), masked entries -inf.
void block_scores(const AttentionDims& dims, const float* q, const float* k, int64_t r0,
                  int64_t rows, int64_t cols, float* scores) {
  sgemm(false, true, rows, cols, dims.d, dims.scale, q + r0 * dims.d, dims.d, k, dims.d, 0.0f,
        scores, cols);
  if (!dims.causal) return;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t first_masked = std::min(cols, r0 + i + 1);
    std::fill(scores + i * cols + first_masked, scores + (i + 1) * cols, kNegInf);
  }
}

// One batch-head forward: q (T,D), k (S,D), v (S,Dv) -> out (T,Dv), lse (T).
void attention_forward(const AttentionDims& dims, const float* q, const float* k, const float* v,
                       float* out, float* lse, std::vector<float>& scores) {
  for (int64_t r0 = 0; r0 < dims.t; r0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, dims.t - r0);
    const int64_t cols = dims.cols(r0 + rows);
    scores.resize(static_cast<size_t>(rows * cols));
    block_scores(dims, q, k, r0, rows, cols, scores.data());
    for (int64_t i = 0; i < rows; ++i) {
      float* row = scores.data() + i * cols;
      // Row r0 + i sees at least key 0 whenever S >= 1, so max is finite.
      float max = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < cols; ++j) max = std::max(max, row[j]);
      const double total = kernels::vecmath::exp_shifted(row, max, row, cols);
      const float inv = static_cast<float>(1.0 / total);
      for (int64_t j = 0; j < cols; ++j) row[j] *= inv;
      lse[r0 + i] = max + static_cast<float>(std::log(total));
    }
    sgemm(false, false, rows, dims.dv, cols, 1.0f, scores.data(), cols, v, dims.dv, 0.0f,
          out + r0 * dims.dv, dims.dv);
  }
}

// One batch-head backward. gq (T,D) is overwritten; gk (S,D) and gv (S,Dv) must start at zero.
void attention_backward(const AttentionDims& dims, const float* q, const float* k, const float* v,
                        const float* out, const float* lse, const float* gout, float* gq, float* gk,
                        float* gv, std::vector<float>& p, std::vector<float>& dp) {
  std::vector<float> delta(static_cast<size_t>(dims.t));
  for (int64_t i = 0; i < dims.t; ++i) {
    double sum = 0;
    for (int64_t c = 0; c < dims.dv; ++c) sum += gout[i * dims.dv + c] * out[i * dims.dv + c];
    delta[i] = static_cast<float>(sum);
  }
  for (int64_t r0 = 0; r0 < dims.t; r0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, dims.t - r0);
    const int64_t cols = dims.cols(r0 + rows);
    p.resize(static_cast<size_t>(rows * cols));
    dp.resize(static_cast<size_t>(rows * cols));
    block_scores(dims, q, k, r0, rows, cols, p.data());
    for (int64_t i = 0; i < rows; ++i) {
      float* row = p.data() + i * cols;
      kernels::vecmath::exp_shifted(row, lse[r0 + i], row, cols);  // masked: exp(-inf) = 0
    }
    const float* gout_block = gout + r0 * dims.dv;
    sgemm(true, false, cols, dims.dv, rows, 1.0f, p.data(), cols, gout_block, dims.dv, 1.0f, gv,
          dims.dv);
    sgemm(false, true, rows, cols, dims.dv, 1.0f, gout_block, dims.dv, v, dims.dv, 0.0f, dp.data(),
          cols);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t at = i * cols + j;
        dp[at] = p[at] * (dp[at] - delta[r0 + i]);  // ds, in place of dp
      }
    }
    sgemm(false, false, rows, dims.d, cols, dims.scale, dp.data(), cols, k, dims.d, 0.0f,
          gq + r0 * dims.d, dims.d);
    sgemm(true, false, cols, dims.d, rows, dims.scale, dp.data(), cols, q + r0 * dims.d, dims.d,
          1.0f, gk, dims.d);
  }
}

AttentionDims check_dims(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal,
                         std::optional<double> scale) {
  constexpr const char* kOp = "scaled_dot_product_attention";
  HSGD_CHECK(q.defined() && k.defined() && v.defined(), kOp, ": query, key or value is undefined");
  HSGD_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(), kOp,
             ": query, key and value must have the same number (>= 2) of dims (...,T,D), "
             "(...,S,D), (...,S,Dv), got query ",
             shape_str(q.shape()), ", key ", shape_str(k.shape()), ", value ",
             shape_str(v.shape()));
  const Shape batch(q.shape().begin(), q.shape().end() - 2);
  HSGD_CHECK(Shape(k.shape().begin(), k.shape().end() - 2) == batch &&
                 Shape(v.shape().begin(), v.shape().end() - 2) == batch,
             kOp, ": the leading dims of query ", shape_str(q.shape()), ", key ",
             shape_str(k.shape()), " and value ", shape_str(v.shape()),
             " must be equal (no broadcasting)");
  HSGD_CHECK(k.size(-1) == q.size(-1), kOp, ": key ", shape_str(k.shape()),
             " must have the query's embedding size D = ", q.size(-1), " (query ",
             shape_str(q.shape()), ")");
  HSGD_CHECK(v.size(-2) == k.size(-2), kOp, ": value ", shape_str(v.shape()),
             " must have the key's sequence length S = ", k.size(-2), " (key ",
             shape_str(k.shape()), ")");
  HSGD_CHECK(k.size(-2) >= 1, kOp, ": key ", shape_str(k.shape()),
             " has no positions (S = 0): softmax over no keys is undefined");
  HSGD_CHECK(!scale || std::isfinite(*scale), kOp, ": scale ", scale.value_or(0),
             " must be finite");
  AttentionDims dims{};
  dims.heads = shape_numel(batch);
  dims.t = q.size(-2);
  dims.s = k.size(-2);
  dims.d = q.size(-1);
  dims.dv = v.size(-1);
  dims.causal = is_causal;
  dims.scale = static_cast<float>(
      scale.value_or(1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(dims.d, 1)))));
  return dims;
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    bool is_causal, std::optional<double> scale) {
  const AttentionDims dims = check_dims(query, key, value, is_causal, scale);
  const Tensor q = query.detach().contiguous();  // (N,T,D)
  const Tensor k = key.detach().contiguous();    // (N,S,D)
  const Tensor v = value.detach().contiguous();  // (N,S,Dv)
  Shape out_shape = query.shape();
  out_shape.back() = dims.dv;
  Tensor out = empty(out_shape);             // (N,T,Dv)
  Tensor lse = empty({dims.heads, dims.t});  // (N,T) log-sum-exp of each row's scores
  std::vector<float> scores;
  for (int64_t h = 0; h < dims.heads; ++h) {
    attention_forward(dims, q.data() + h * dims.t * dims.d, k.data() + h * dims.s * dims.d,
                      v.data() + h * dims.s * dims.dv, out.data() + h * dims.t * dims.dv,
                      lse.data() + h * dims.t, scores);
  }
  if (autograd::needs_grad({query, key, value})) {
    autograd::record(out, "ScaledDotProductAttentionBackward", {query, key, value},
                     [dims, q, k, v, lse, y = out.detach()](const Tensor& g, const NeedsGrad&) {
                       const Tensor gc = g.contiguous();  // (N,T,Dv)
                       Tensor gq = empty(q.shape());      // (N,T,D)
                       Tensor gk = zeros(k.shape());      // (N,S,D)
                       Tensor gv = zeros(v.shape());      // (N,S,Dv)
                       std::vector<float> p, dp;
                       for (int64_t h = 0; h < dims.heads; ++h) {
                         const int64_t qo = h * dims.t * dims.d, ko = h * dims.s * dims.d;
                         const int64_t vo = h * dims.s * dims.dv, oo = h * dims.t * dims.dv;
                         attention_backward(dims, q.data() + qo, k.data() + ko, v.data() + vo,
                                            y.data() + oo, lse.data() + h * dims.t, gc.data() + oo,
                                            gq.data() + qo, gk.data() + ko, gv.data() + vo, p, dp);
                       }
                       return std::vector<Tensor>{gq, gk, gv};
                     });
  }
  return out;
}

}  // namespace hsgd
