#pragma once
// nn::utils::clip_grad_norm_, as torch.nn.utils.clip_grad_norm_ in PyTorch 1.13.
//
// The total norm is the norm_type-norm of all gradients taken together, i.e. the norm of the
// per-parameter norms (max |g| for norm_type = infinity). Every gradient is then multiplied in
// place by min(1, max_norm / (total_norm + 1e-6)). Parameters without a gradient are skipped;
// with none at all the result is 0. Returns the total norm BEFORE clipping.
//
// Usage:
//   loss.backward();
//   double norm = nn::utils::clip_grad_norm_(model->parameters(), 1.0);
//   nn::utils::clip_grad_norm_(params, 0.5, std::numeric_limits<double>::infinity());
//   optimizer->step();
//
// Errors (InvalidArgument naming the value): max_norm < 0 or NaN; norm_type neither > 0 nor
// infinity; with error_if_nonfinite, a total norm that is NaN or infinite (the gradients are left
// unchanged then, as torch).

#include <vector>

#include "framework/tensor/tensor.h"

namespace hsgd::nn::utils {

double clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false);

}  // namespace hsgd::nn::utils
