// cross_entropy with class weights, ignore_index and label smoothing (torch's mean reduction).

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/tensor/ops.h"

namespace hsgd {

using autograd::NeedsGrad;

namespace {

// The loss as a function of logp (N,C) = log_softmax(logits): with a_i = weight[t_i] (1 without
// weights) over the rows whose target is not ignored and A = sum a_i,
//   nll    = -sum_i a_i logp[i, t_i] / A
//   smooth = -sum_i sum_c weight[c] logp[i, c] / A
//   loss   = (1 - s) nll + s / C * smooth
// which is how torch 1.13 combines nll_loss and the smoothing term for reduction 'mean'.
Tensor weighted_smoothed_nll(const Tensor& logp, const std::vector<int64_t>& targets,
                             const Tensor& weight, int64_t ignore_index, double smoothing) {
  const int64_t n = logp.size(0), c = logp.size(1);
  const Tensor lc = logp.detach().contiguous();
  std::vector<double> w(static_cast<size_t>(c), 1.0);
  if (weight.defined()) {
    const std::vector<float> wv = weight.to_vector();
    for (int64_t j = 0; j < c; ++j) w[j] = wv[j];
  }
  double total_weight = 0, nll = 0, smooth = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (targets[i] == ignore_index) continue;
    const float* row = lc.data() + i * c;
    total_weight += w[targets[i]];
    nll -= w[targets[i]] * row[targets[i]];
    if (smoothing != 0) {
      for (int64_t j = 0; j < c; ++j) smooth -= w[j] * row[j];
    }
  }
  const double cd = static_cast<double>(c);
  const double loss =
      (1 - smoothing) * (nll / total_weight) + smoothing / cd * (smooth / total_weight);
  Tensor out = full({}, static_cast<float>(loss));
  if (autograd::needs_grad({logp})) {
    autograd::record(out, "CrossEntropyLossBackward", {logp},
                     [targets, w, n, c, ignore_index, smoothing, total_weight, cd](
                         const Tensor& g, const NeedsGrad&) {
                       Tensor gx = zeros({n, c});
                       const double scale = static_cast<double>(g.item()) / total_weight;
                       for (int64_t i = 0; i < n; ++i) {
                         if (targets[i] == ignore_index) continue;
                         float* row = gx.data() + i * c;
                         if (smoothing != 0) {
                           for (int64_t j = 0; j < c; ++j)
                             row[j] = static_cast<float>(-scale * smoothing / cd * w[j]);
                         }
                         row[targets[i]] +=
                             static_cast<float>(-scale * (1 - smoothing) * w[targets[i]]);
                       }
                       return std::vector<Tensor>{gx};
                     });
  }
  return out;
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const std::vector<int64_t>& targets,
                     const Tensor& weight, int64_t ignore_index, double label_smoothing) {
  HSGD_CHECK(logits.defined() && logits.dim() == 2, "cross_entropy: logits must be (N,C), got ",
             logits.defined() ? shape_str(logits.shape()) : std::string("undefined"));
  const int64_t n = logits.size(0), c = logits.size(1);
  HSGD_CHECK(static_cast<int64_t>(targets.size()) == n, "cross_entropy: got ", targets.size(),
             " targets for a batch of ", n, " (logits shape ", shape_str(logits.shape()), ")");
  HSGD_CHECK(n > 0, "cross_entropy: the batch is empty");
  HSGD_CHECK(label_smoothing >= 0 && label_smoothing <= 1, "cross_entropy: label_smoothing ",
             label_smoothing, " must be in [0, 1]");
  HSGD_CHECK(!weight.defined() || weight.shape() == Shape{c}, "cross_entropy: weight has shape ",
             weight.defined() ? shape_str(weight.shape()) : std::string(),
             ", expected one weight per class: [", c, "]");
  check_class_targets("cross_entropy", targets, c, ignore_index);
  const bool ignores = std::find(targets.begin(), targets.end(), ignore_index) != targets.end();
  // The plain case stays on the original path (same values, bit for bit, as before options).
  if (!weight.defined() && !ignores && label_smoothing == 0) return cross_entropy(logits, targets);
  return weighted_smoothed_nll(log_softmax(logits, 1), targets, weight, ignore_index,
                               label_smoothing);
}

}  // namespace hsgd
