// scaled_dot_product_attention: forward and backward, one block of query rows at a time.
//
// Per batch-head, for each block of at most kRowBlock query rows [r0, r1):
//   forward:  s = q[r0:r1] k^T * scale                      (rows, cols) on sgemm
//             p = softmax(s) row by row over the keys j <= i (causal) or all, 0 past them;
//             lse[i] = log sum_j exp(s[i][j]) over those keys is saved
//             out[r0:r1] = p v                               (rows, Dv) on sgemm
//   backward: delta[i] = sum_c gout[i][c] * out[i][c]
//             p = exp(q k^T * scale - lse) recomputed for the block (0 where masked)
//             (the masked entries of a row are never exponentiated: they are set to 0)
//             gv += p^T gout[r0:r1];  dp = gout[r0:r1] v^T
//             ds = p * (dp - delta)
//             gq[r0:r1] = ds k * scale;  gk += ds^T q[r0:r1] * scale
// With is_causal, a block only needs the keys [0, min(S, r1)): the columns past the block's
// last row are masked for every row of it, so they are neither computed nor stored.

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <vector>

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/kernels/sgemm.h"
#include "framework/kernels/vec_math.h"
#include "framework/parallel/parallel.h"
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
  // The keys query row i attends to: [0, visible(i)) (at most S).
  int64_t visible(int64_t i) const { return causal ? std::min(s, i + 1) : s; }
};

// One head's (rows, cols) matrix inside a tensor: its first entry and its row stride (entries of
// a row are adjacent).
struct HeadMatrix {
  const float* data;
  int64_t ld;
  const float* row(int64_t i) const { return data + i * ld; }
};

// Where each head's matrix of x (...,R,C) starts (in floats from x.data(), heads in row-major
// order of the leading dims) and the row stride they share. Such a layout exists when x's last dim
// is unit-stride (or of size 1) and its rows do not overlap; readable() says whether it does.
struct HeadLayout {
  std::vector<int64_t> offsets;
  int64_t ld;

  static bool readable(const Tensor& x) {
    const int64_t nd = x.dim();
    const bool unit_columns = x.size(-1) <= 1 || x.strides()[nd - 1] == 1;
    return unit_columns && (x.size(-2) <= 1 || x.strides()[nd - 2] >= x.size(-1));
  }

  explicit HeadLayout(const Tensor& x) : offsets(1, 0) {
    const int64_t nd = x.dim();
    for (int64_t d = 0; d < nd - 2; ++d) {
      std::vector<int64_t> next;
      next.reserve(offsets.size() * static_cast<size_t>(x.size(d)));
      for (int64_t o : offsets) {
        for (int64_t i = 0; i < x.size(d); ++i) next.push_back(o + i * x.strides()[d]);
      }
      offsets = std::move(next);
    }
    // A single row has no meaningful stride; sgemm still wants one of at least its length.
    ld = x.size(-2) <= 1 ? std::max<int64_t>(x.size(-1), 1) : x.strides()[nd - 2];
  }
};

// x itself when its heads can be read in place, else a contiguous copy. Detached.
Tensor readable_heads(const Tensor& x) {
  const Tensor d = x.detach();
  return HeadLayout::readable(d) ? d : d.contiguous();
}

// A tensor of `shape` (like's number of dims) whose memory orders the dims as like's strides do,
// largest first, the last dim kept last; zero-filled when zero. For q (B,H,T,D) viewing a
// (B,T,H,D) buffer (heads split off a linear layer's output), the result is a (B,H,T,D) view of a
// (B,T,H,D) buffer, which the caller turns back into (B,T,H*D) without a copy.
Tensor empty_in_layout_of(const Tensor& like, const Shape& shape, bool zero) {
  const auto nd = static_cast<int64_t>(shape.size());
  std::vector<int64_t> order(static_cast<size_t>(nd - 1));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return like.strides()[a] > like.strides()[b]; });
  order.push_back(nd - 1);
  Shape ordered;
  std::vector<int64_t> inverse(static_cast<size_t>(nd));
  for (int64_t i = 0; i < nd; ++i) {
    ordered.push_back(shape[order[i]]);
    inverse[order[i]] = i;
  }
  return (zero ? zeros(ordered) : empty(ordered)).permute(inverse);
}

// fn(lo, hi) over the heads [0, heads): split across the pool when there are enough heads to
// keep every thread busy (each head then runs its products on one thread), else on the calling
// thread, whose products split across the pool themselves.
template <typename Fn>
void for_each_head_range(int64_t heads, const Fn& fn) {
  if (heads >= get_num_threads()) {
    parallel_for(0, heads, 1, fn);
  } else {
    fn(0, heads);
  }
}

// scores (rows, cols) of query rows [r0, r0 + rows) against keys [0, cols), unmasked: the
// callers work on the first dims.visible(r0 + i) entries of row i and zero the rest.
void block_scores(const AttentionDims& dims, HeadMatrix q, HeadMatrix k, int64_t r0, int64_t rows,
                  int64_t cols, float* scores) {
  sgemm(false, true, rows, cols, dims.d, dims.scale, q.row(r0), q.ld, k.data, k.ld, 0.0f, scores,
        cols);
}

// One batch-head forward: q (T,D), k (S,D), v (S,Dv) -> out (T,Dv) (row stride ldo), lse (T).
void attention_forward(const AttentionDims& dims, HeadMatrix q, HeadMatrix k, HeadMatrix v,
                       float* out, int64_t ldo, float* lse, std::vector<float>& scores) {
  for (int64_t r0 = 0; r0 < dims.t; r0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, dims.t - r0);
    const int64_t cols = dims.cols(r0 + rows);
    scores.resize(static_cast<size_t>(rows * cols));
    block_scores(dims, q, k, r0, rows, cols, scores.data());
    for (int64_t i = 0; i < rows; ++i) {
      float* row = scores.data() + i * cols;
      const int64_t visible = std::min(cols, dims.visible(r0 + i));
      // Row r0 + i sees at least key 0 whenever S >= 1, so max is finite.
      const float max = kernels::vecmath::max(row, visible);
      const double total = kernels::vecmath::exp_shifted(row, max, row, visible);
      kernels::vecmath::scale(row, static_cast<float>(1.0 / total), row, visible);
      std::fill(row + visible, row + cols, 0.0f);
      lse[r0 + i] = max + static_cast<float>(std::log(total));
    }
    sgemm(false, false, rows, dims.dv, cols, 1.0f, scores.data(), cols, v.data, v.ld, 0.0f,
          out + r0 * ldo, ldo);
  }
}

// Gradients of one batch-head, written with row strides ld_gq, ld_gk, ld_gv.
struct HeadGrads {
  float* gq;  // (T,D), overwritten
  float* gk;  // (S,D), must start at zero
  float* gv;  // (S,Dv), must start at zero
  int64_t ld_gq, ld_gk, ld_gv;
};

// One batch-head backward from y = out (T,Dv) and its gradient gout (T,Dv).
void attention_backward(const AttentionDims& dims, HeadMatrix q, HeadMatrix k, HeadMatrix v,
                        HeadMatrix y, const float* lse, HeadMatrix gout, const HeadGrads& g,
                        std::vector<float>& p, std::vector<float>& dp, std::vector<float>& delta) {
  delta.resize(static_cast<size_t>(dims.t));
  for (int64_t i = 0; i < dims.t; ++i) {
    delta[i] = static_cast<float>(kernels::vecmath::dot(gout.row(i), y.row(i), dims.dv));
  }
  for (int64_t r0 = 0; r0 < dims.t; r0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, dims.t - r0);
    const int64_t cols = dims.cols(r0 + rows);
    p.resize(static_cast<size_t>(rows * cols));
    dp.resize(static_cast<size_t>(rows * cols));
    block_scores(dims, q, k, r0, rows, cols, p.data());
    for (int64_t i = 0; i < rows; ++i) {
      float* row = p.data() + i * cols;
      const int64_t visible = std::min(cols, dims.visible(r0 + i));
      kernels::vecmath::exp_shifted(row, lse[r0 + i], row, visible);
      std::fill(row + visible, row + cols, 0.0f);
    }
    sgemm(true, false, cols, dims.dv, rows, 1.0f, p.data(), cols, gout.row(r0), gout.ld, 1.0f, g.gv,
          g.ld_gv);
    sgemm(false, true, rows, cols, dims.dv, 1.0f, gout.row(r0), gout.ld, v.data, v.ld, 0.0f,
          dp.data(), cols);
    for (int64_t i = 0; i < rows; ++i) {  // ds, in place of dp; 0 where p is masked
      float* row = dp.data() + i * cols;
      const int64_t visible = std::min(cols, dims.visible(r0 + i));
      kernels::vecmath::softmax_backward(p.data() + i * cols, row, delta[r0 + i], row, visible);
      std::fill(row + visible, row + cols, 0.0f);
    }
    sgemm(false, false, rows, dims.d, cols, dims.scale, dp.data(), cols, k.data, k.ld, 0.0f,
          g.gq + r0 * g.ld_gq, g.ld_gq);
    sgemm(true, false, cols, dims.d, rows, dims.scale, dp.data(), cols, q.row(r0), q.ld, 1.0f, g.gk,
          g.ld_gk);
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
  // Heads are read where they are (a (B,H,T,D) view of a linear layer's (B,T,C) output included).
  const Tensor q = readable_heads(query);  // (N...,T,D)
  const Tensor k = readable_heads(key);    // (N...,S,D)
  const Tensor v = readable_heads(value);  // (N...,S,Dv)
  Shape out_shape = query.shape();
  out_shape.back() = dims.dv;
  Tensor out = empty_in_layout_of(q, out_shape, false);  // (N...,T,Dv)
  Tensor lse = empty({dims.heads, dims.t});              // (N,T) log-sum-exp of each row's scores
  {
    const HeadLayout lq(q), lk(k), lv(v), lo(out);
    float* po = out.data();
    float* plse = lse.data();
    for_each_head_range(dims.heads, [&](int64_t lo_head, int64_t hi_head) {
      std::vector<float> scores;
      for (int64_t h = lo_head; h < hi_head; ++h) {
        attention_forward(dims, {q.data() + lq.offsets[h], lq.ld},
                          {k.data() + lk.offsets[h], lk.ld}, {v.data() + lv.offsets[h], lv.ld},
                          po + lo.offsets[h], lo.ld, plse + h * dims.t, scores);
      }
    });
  }
  if (autograd::needs_grad({query, key, value})) {
    autograd::record(
        out, "ScaledDotProductAttentionBackward", {query, key, value},
        [dims, q, k, v, lse, y = out.detach()](const Tensor& g, const NeedsGrad&) {
          const Tensor gc = readable_heads(g);                  // (N...,T,Dv)
          Tensor gq = empty_in_layout_of(q, q.shape(), false);  // (N...,T,D)
          Tensor gk = empty_in_layout_of(k, k.shape(), true);   // (N...,S,D)
          Tensor gv = empty_in_layout_of(v, v.shape(), true);   // (N...,S,Dv)
          const HeadLayout lq(q), lk(k), lv(v), ly(y), lg(gc), lgq(gq), lgk(gk), lgv(gv);
          for_each_head_range(dims.heads, [&](int64_t lo_head, int64_t hi_head) {
            std::vector<float> p, dp, delta;
            for (int64_t h = lo_head; h < hi_head; ++h) {
              const HeadGrads grads{gq.data() + lgq.offsets[h],
                                    gk.data() + lgk.offsets[h],
                                    gv.data() + lgv.offsets[h],
                                    lgq.ld,
                                    lgk.ld,
                                    lgv.ld};
              attention_backward(
                  dims, {q.data() + lq.offsets[h], lq.ld}, {k.data() + lk.offsets[h], lk.ld},
                  {v.data() + lv.offsets[h], lv.ld}, {y.data() + ly.offsets[h], ly.ld},
                  lse.data() + h * dims.t, {gc.data() + lg.offsets[h], lg.ld}, grads, p, dp, delta);
            }
          });
          return std::vector<Tensor>{gq, gk, gv};
        });
  }
  return out;
}

}  // namespace hsgd
