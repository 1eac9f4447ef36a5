// log_softmax, softmax, nll_loss, cross_entropy, mse_loss.

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/kernels/vec_math.h"
#include "framework/parallel/parallel.h"
#include "framework/tensor/ops.h"
#include "framework/tensor/tensor_impl.h"

namespace hsgd {

using autograd::NeedsGrad;

namespace {

struct Split {
  int64_t outer = 1, len = 1, inner = 1;
};

Split split_at(const Tensor& x, int64_t& dim, const char* op) {
  const int64_t n = x.dim();
  HSGD_CHECK(dim >= -n && dim < n, op, ": dim ", dim, " out of range for shape ",
             shape_str(x.shape()));
  if (dim < 0) dim += n;
  Split r;
  for (int64_t i = 0; i < dim; ++i) r.outer *= x.size(i);
  r.len = x.size(dim);
  for (int64_t i = dim + 1; i < n; ++i) r.inner *= x.size(i);
  return r;
}

// Rows per parallel_for chunk: about kGrain elements.
constexpr int64_t kGrain = 16384;

int64_t row_grain(const Split& sp) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(sp.len, 1));
}

// ---- contiguous rows (inner == 1): vecmath's exp ----

// The row maximum (-inf for an empty row).
float row_max(const float* x, int64_t len) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t k = 0; k < len; ++k) max = std::max(max, x[k]);
  return max;
}

// y (rows, len) = log_softmax of rows [lo, hi) of x (rows, len).
void log_softmax_rows(const float* x, int64_t len, int64_t lo, int64_t hi, float* y) {
  for (int64_t r = lo; r < hi; ++r) {
    const float* px = x + r * len;
    float* py = y + r * len;
    const float max = row_max(px, len);
    const double total = kernels::vecmath::exp_shifted(px, max, py, len);  // py as scratch
    // (x - max) - log(total), not x - (max + log(total)): for large logits the latter rounds.
    const float log_total = static_cast<float>(std::log(total));
    for (int64_t k = 0; k < len; ++k) py[k] = (px[k] - max) - log_total;
  }
}

// gx = g - exp(y) * sum(g) along rows [lo, hi) of (rows, len).
void log_softmax_backward_rows(const float* g, const float* y, int64_t len, int64_t lo, int64_t hi,
                               float* gx) {
  kernels::vecmath::exp(y + lo * len, gx + lo * len, (hi - lo) * len);
  for (int64_t r = lo; r < hi; ++r) {
    const float* pg = g + r * len;
    float* pgx = gx + r * len;
    double total = 0;
    for (int64_t k = 0; k < len; ++k) total += pg[k];
    const float s = static_cast<float>(total);
    for (int64_t k = 0; k < len; ++k) pgx[k] = pg[k] - pgx[k] * s;
  }
}

// y (rows, len) = softmax of rows [lo, hi) of x (rows, len).
void softmax_rows(const float* x, int64_t len, int64_t lo, int64_t hi, float* y) {
  for (int64_t r = lo; r < hi; ++r) {
    const float* px = x + r * len;
    float* py = y + r * len;
    const double total = kernels::vecmath::exp_shifted(px, row_max(px, len), py, len);
    const float inv = static_cast<float>(1.0 / total);
    for (int64_t k = 0; k < len; ++k) py[k] *= inv;
  }
}

// gx = y * (g - sum(g * y)) along rows [lo, hi) of (rows, len) (the softmax backward).
void softmax_backward_rows(const float* g, const float* y, int64_t len, int64_t lo, int64_t hi,
                           float* gx) {
  for (int64_t r = lo; r < hi; ++r) {
    const float* pg = g + r * len;
    const float* py = y + r * len;
    float* pgx = gx + r * len;
    double dot = 0;
    for (int64_t k = 0; k < len; ++k) dot += static_cast<double>(pg[k]) * py[k];
    const float d = static_cast<float>(dot);
    for (int64_t k = 0; k < len; ++k) pgx[k] = py[k] * (pg[k] - d);
  }
}

// ---- strided (inner > 1) ----

// y = log_softmax(x) along len; x, y are (outer, len, inner) contiguous.
void log_softmax_strided(const float* x, const Split& sp, float* y) {
  for (int64_t o = 0; o < sp.outer; ++o) {
    for (int64_t i = 0; i < sp.inner; ++i) {
      const float* px = x + o * sp.len * sp.inner + i;
      float* py = y + o * sp.len * sp.inner + i;
      float max = -std::numeric_limits<float>::infinity();
      for (int64_t k = 0; k < sp.len; ++k) max = std::max(max, px[k * sp.inner]);
      double total = 0;
      for (int64_t k = 0; k < sp.len; ++k) total += std::exp(px[k * sp.inner] - max);
      const float log_total = static_cast<float>(std::log(total));
      for (int64_t k = 0; k < sp.len; ++k) py[k * sp.inner] = (px[k * sp.inner] - max) - log_total;
    }
  }
}

// gx = g - exp(y) * sum(g) along len (the log_softmax backward).
void log_softmax_backward_strided(const float* g, const float* y, const Split& sp, float* gx) {
  for (int64_t o = 0; o < sp.outer; ++o) {
    for (int64_t i = 0; i < sp.inner; ++i) {
      const int64_t base = o * sp.len * sp.inner + i;
      double total = 0;
      for (int64_t k = 0; k < sp.len; ++k) total += g[base + k * sp.inner];
      const float s = static_cast<float>(total);
      for (int64_t k = 0; k < sp.len; ++k) {
        const int64_t at = base + k * sp.inner;
        gx[at] = g[at] - std::exp(y[at]) * s;
      }
    }
  }
}

void log_softmax_kernel(const float* x, const Split& sp, float* y) {
  if (sp.inner != 1) return log_softmax_strided(x, sp, y);
  parallel_for(0, sp.outer, row_grain(sp),
               [&](int64_t lo, int64_t hi) { log_softmax_rows(x, sp.len, lo, hi, y); });
}

void log_softmax_backward_kernel(const float* g, const float* y, const Split& sp, float* gx) {
  if (sp.inner != 1) return log_softmax_backward_strided(g, y, sp, gx);
  parallel_for(0, sp.outer, row_grain(sp), [&](int64_t lo, int64_t hi) {
    log_softmax_backward_rows(g, y, sp.len, lo, hi, gx);
  });
}

}  // namespace

Tensor log_softmax(const Tensor& x, int64_t dim) {
  HSGD_CHECK(x.defined(), "log_softmax: the input is undefined");
  const Split sp = split_at(x, dim, "log_softmax");
  const Tensor c = x.detach().contiguous();
  Tensor out = empty(x.shape());
  log_softmax_kernel(c.data(), sp, out.data());
  if (autograd::needs_grad({x})) {
    autograd::record(out, "LogSoftmaxBackward", {x},
                     [y = out.detach(), sp](const Tensor& g, const NeedsGrad&) {
                       const Tensor gc = g.contiguous();
                       Tensor gx = empty(y.shape());
                       log_softmax_backward_kernel(gc.data(), y.data(), sp, gx.data());
                       return std::vector<Tensor>{gx};
                     });
  }
  return out;
}

Tensor softmax(const Tensor& x, int64_t dim) {
  HSGD_CHECK(x.defined(), "softmax: the input is undefined");
  const Split sp = split_at(x, dim, "softmax");
  if (sp.inner != 1) return exp(log_softmax(x, dim));
  const Tensor c = x.detach().contiguous();  // (outer, len)
  Tensor out = empty(x.shape());             // (outer, len)
  parallel_for(0, sp.outer, row_grain(sp),
               [&](int64_t lo, int64_t hi) { softmax_rows(c.data(), sp.len, lo, hi, out.data()); });
  if (autograd::needs_grad({x})) {
    autograd::record(out, "SoftmaxBackward", {x},
                     [y = out.detach(), sp](const Tensor& g, const NeedsGrad&) {
                       const Tensor gc = g.contiguous();
                       Tensor gx = empty(y.shape());
                       parallel_for(0, sp.outer, row_grain(sp), [&](int64_t lo, int64_t hi) {
                         softmax_backward_rows(gc.data(), y.data(), sp.len, lo, hi, gx.data());
                       });
                       return std::vector<Tensor>{gx};
                     });
  }
  return out;
}

Tensor nll_loss(const Tensor& logp, const std::vector<int64_t>& targets) {
  HSGD_CHECK(logp.defined(), "nll_loss: the input is undefined");
  HSGD_CHECK(logp.dim() == 2, "nll_loss: input must be (N,C), got shape ", shape_str(logp.shape()));
  const int64_t n = logp.size(0), c = logp.size(1);
  HSGD_CHECK(static_cast<int64_t>(targets.size()) == n, "nll_loss: got ", targets.size(),
             " targets for a batch of ", n, " (input shape ", shape_str(logp.shape()), ")");
  HSGD_CHECK(n > 0, "nll_loss: the batch is empty");
  check_class_targets("nll_loss", targets, c);
  const Tensor lc = logp.detach().contiguous();
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += lc.data()[i * c + targets[i]];
  Tensor out = full({}, static_cast<float>(-total / static_cast<double>(n)));
  if (autograd::needs_grad({logp})) {
    autograd::record(out, "NllLossBackward", {logp},
                     [targets, n, c](const Tensor& g, const NeedsGrad&) {
                       Tensor gx = zeros({n, c});
                       const float v = -g.item() / static_cast<float>(n);
                       for (int64_t i = 0; i < n; ++i) gx.data()[i * c + targets[i]] = v;
                       return std::vector<Tensor>{gx};
                     });
  }
  return out;
}

void check_class_targets(const char* op, const std::vector<int64_t>& targets, int64_t num_classes,
                         std::optional<int64_t> ignore_index,
                         std::span<const int64_t> dataset_indices) {
  const auto n = static_cast<int64_t>(targets.size());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = targets[static_cast<size_t>(i)];
    if ((t >= 0 && t < num_classes) || (ignore_index && t == *ignore_index)) continue;
    const std::string where =
        static_cast<int64_t>(dataset_indices.size()) == n
            ? str_cat(" (dataset index ", dataset_indices[static_cast<size_t>(i)], ")")
            : std::string();
    const std::string or_ignored =
        ignore_index ? str_cat(" or ignore_index ", *ignore_index) : std::string();
    HSGD_THROW(InvalidArgument, op, ": sample ", i, " of the batch of ", n, where, " has target ",
               t, ", expected a class index in [0, ", num_classes, ")", or_ignored,
               " (the input has ", num_classes, " classes)");
  }
}

Tensor cross_entropy(const Tensor& logits, const std::vector<int64_t>& targets) {
  HSGD_CHECK(logits.defined() && logits.dim() == 2, "cross_entropy: logits must be (N,C), got ",
             logits.defined() ? shape_str(logits.shape()) : std::string("undefined"));
  // Checked here so that a bad label names the function the caller called, not nll_loss.
  check_class_targets("cross_entropy", targets, logits.size(1));
  return nll_loss(log_softmax(logits, 1), targets);
}

std::vector<int64_t> to_indices(const Tensor& t) {
  HSGD_CHECK(t.defined(), "to_indices: the tensor is undefined");
  const std::vector<float> values = t.to_vector();
  std::vector<int64_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const float v = values[i];
    HSGD_CHECK(v >= 0 && v == std::floor(v) && v < 16777216.0f, "to_indices: element ", i, " is ",
               v, ", expected a non-negative integer below 2^24");
    out[i] = static_cast<int64_t>(v);
  }
  return out;
}

Tensor from_indices(const std::vector<int64_t>& indices) {
  Tensor t = empty({static_cast<int64_t>(indices.size())});
  for (size_t i = 0; i < indices.size(); ++i) {
    HSGD_CHECK(indices[i] >= 0 && indices[i] < (int64_t{1} << 24), "from_indices: index ", i,
               " is ", indices[i], ", expected 0 <= index < 2^24");
    t.data()[i] = static_cast<float>(indices[i]);
  }
  return t;
}

Tensor mse_loss(const Tensor& a, const Tensor& b) {
  HSGD_CHECK(a.shape() == b.shape(), "mse_loss: shapes differ: ", shape_str(a.shape()), " vs ",
             shape_str(b.shape()));
  const Tensor d = sub(a, b);
  return mean(mul(d, d));
}

// ---- IndexTensor targets ----

namespace {

// logits (N,C,d...) and targets (N,d...) as (N*d..., C) rows and their targets; (N,C) and (N) as
// they are.
std::pair<Tensor, std::vector<int64_t>> class_rows(const char* op, const Tensor& logits,
                                                   const IndexTensor& targets) {
  HSGD_CHECK(logits.defined() && targets.defined(), op, ": logits or targets undefined");
  Shape expected;
  if (logits.dim() >= 2) {
    expected.push_back(logits.size(0));
    for (int64_t d = 2; d < logits.dim(); ++d) expected.push_back(logits.size(d));
  }
  HSGD_CHECK(logits.dim() >= 2 && targets.shape() == expected, op, ": logits ",
             shape_str(logits.shape()), " and targets ", shape_str(targets.shape()),
             " do not match; expected logits (N,C) with targets (N), or (N,C,d1,...) with "
             "(N,d1,...)");
  if (logits.dim() == 2) return {logits, targets.to_vector()};
  std::vector<int64_t> order{0};
  for (int64_t d = 2; d < logits.dim(); ++d) order.push_back(d);
  order.push_back(1);
  return {logits.permute(order).reshape({-1, logits.size(1)}), targets.to_vector()};
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const IndexTensor& targets) {
  auto [rows, t] = class_rows("cross_entropy", logits, targets);
  return cross_entropy(rows, t);
}

Tensor cross_entropy(const Tensor& logits, const IndexTensor& targets, const Tensor& weight,
                     int64_t ignore_index, double label_smoothing) {
  auto [rows, t] = class_rows("cross_entropy", logits, targets);
  return cross_entropy(rows, t, weight, ignore_index, label_smoothing);
}

Tensor nll_loss(const Tensor& logp, const IndexTensor& targets) {
  auto [rows, t] = class_rows("nll_loss", logp, targets);
  return nll_loss(rows, t);
}

}  // namespace hsgd
