#include "framework/nn/functional.h"

#include "comm/error.h"
#include "framework/tensor/ops.h"

namespace hsgd::nn {

Tensor cross_entropy(const Tensor& logits, const std::vector<int64_t>& targets,
                     const CrossEntropyOptions& options) {
  return hsgd::cross_entropy(logits, targets, options.weight, options.ignore_index,
                             options.label_smoothing);
}

Tensor cross_entropy(const Tensor& logits, const IndexTensor& targets,
                     const CrossEntropyOptions& options) {
  return hsgd::cross_entropy(logits, targets, options.weight, options.ignore_index,
                             options.label_smoothing);
}

Tensor nll_loss(const Tensor& logp, const std::vector<int64_t>& targets) {
  return hsgd::nll_loss(logp, targets);
}

double accuracy(const Tensor& logits, const std::vector<int64_t>& targets) {
  HSGD_CHECK(logits.dim() == 2, "accuracy: logits must be (N,C), got shape ",
             shape_str(logits.shape()));
  const int64_t n = logits.size(0), c = logits.size(1);
  HSGD_CHECK_EQ(static_cast<int64_t>(targets.size()), n,
                "accuracy: number of targets must equal the batch size");
  if (n == 0) return 0.0;
  const Tensor x = logits.contiguous();
  const float* p = x.data();  // (N,C)
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t best = 0;
    for (int64_t j = 1; j < c; ++j) {
      if (p[i * c + j] > p[i * c + best]) best = j;
    }
    correct += best == targets[static_cast<size_t>(i)];
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

}  // namespace hsgd::nn
