#pragma once
// Loss functions under hsgd::nn, as torch.nn.functional offers them. They forward to the
// differentiable ops of framework/tensor/ops.h (one implementation, two spellings).
// (Layer functions such as gelu, silu, layer_norm and embedding are in framework/tensor/nn_ops.h.)
//
// Usage:
//   Tensor loss = nn::cross_entropy(model->forward(batch.inputs), batch.targets);
//   loss.backward();

#include <cstdint>
#include <vector>

#include "framework/tensor/index_tensor.h"
#include "framework/tensor/tensor.h"

namespace hsgd::nn {

// torch.nn.functional.cross_entropy's options (reduction is always 'mean').
//   weight           (C) per-class weights, or undefined (all 1): the loss is then the weighted
//                    mean sum_i w[t_i] * loss_i / sum_i w[t_i].
//   ignore_index     rows with this target count for nothing (numerator and denominator).
//   label_smoothing  s in [0, 1]: the target distribution is (1 - s) one-hot + s / C uniform.
struct CrossEntropyOptions {
  Tensor weight = Tensor();
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
};

// Mean over the batch of -log softmax(logits)[i, targets[i]], with the options above. logits
// (N,C); targets has N values, each in [0, C) or equal to ignore_index (InvalidArgument naming
// the bad target, size, weight shape or smoothing otherwise; a bad target as
// hsgd::check_class_targets says: its sample's index in the batch, its value, the number of
// classes). With the default options and no
// target equal to -100 the result is bit for bit hsgd::cross_entropy(logits, targets).
//
// Usage: Tensor l = nn::cross_entropy(x, y, {.ignore_index = 0, .label_smoothing = 0.1});
Tensor cross_entropy(const Tensor& logits, const std::vector<int64_t>& targets,
                     const CrossEntropyOptions& options = {});

// The same with the targets in an IndexTensor, as hsgd::cross_entropy(logits, IndexTensor)
// takes them: logits (N,C) with targets (N), or (N,C,d1,...) with targets (N,d1,...).
Tensor cross_entropy(const Tensor& logits, const IndexTensor& targets,
                     const CrossEntropyOptions& options = {});

// Mean over the batch of -logp[i, targets[i]]; logp (N,C) are log-probabilities.
Tensor nll_loss(const Tensor& logp, const std::vector<int64_t>& targets);

// Fraction of rows of logits (N,C) whose arg-max equals the target (not differentiable).
double accuracy(const Tensor& logits, const std::vector<int64_t>& targets);

}  // namespace hsgd::nn
