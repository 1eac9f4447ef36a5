#pragma once
// Loss functions under hsgd::nn, as torch.nn.functional offers them. They forward to the
// differentiable ops of framework/tensor/ops.h (one implementation, two spellings).
//
// Usage:
//   Tensor loss = nn::cross_entropy(model->forward(batch.inputs), batch.targets);
//   loss.backward();

#include <cstdint>
#include <vector>

#include "framework/tensor/tensor.h"

namespace hsgd::nn {

// Mean over the batch of -log softmax(logits)[i, targets[i]]. logits (N,C); targets has N values
// in [0, C) (InvalidArgument naming the bad target or size otherwise).
Tensor cross_entropy(const Tensor& logits, const std::vector<int64_t>& targets);

// Mean over the batch of -logp[i, targets[i]]; logp (N,C) are log-probabilities.
Tensor nll_loss(const Tensor& logp, const std::vector<int64_t>& targets);

// Fraction of rows of logits (N,C) whose arg-max equals the target (not differentiable).
double accuracy(const Tensor& logits, const std::vector<int64_t>& targets);

}  // namespace hsgd::nn
