#pragma once
// Raw float kernels behind hsgd::batch_norm. The input is viewed as x (N,C,S) with S = H*W for
// (N,C,H,W) input and S = 1 for (N,C) input; statistics are per channel over the M = N*S values.
// Nullable weight/bias pointers mean weight 1 and bias 0 (affine=False). The differentiable op
// is in batch_norm.cpp.

#include <cstdint>

namespace hsgd::kernels {

struct BatchNormShape {
  int64_t n = 0, c = 0, s = 0;             // x is (N,C,S)
  int64_t count() const { return n * s; }  // values per channel
};

// mean (C) and biased variance (C) of x (N,C,S) per channel. Two passes (mean, then centred
// squares) with double-precision accumulation across planes, so a large mean does not cancel.
void batch_norm_statistics(const float* x, const BatchNormShape& shape, float* mean, float* var);

// y (N,C,S) = (x - mean[c]) * invstd[c] * weight[c] + bias[c], plus residual (N,C,S) when not
// null, then max(y, 0) when relu (batch norm, a residual add and ReLU in one pass over memory).
// Each step rounds as the separate ops would: the sum is taken after the normalised value.
void batch_norm_normalize(const float* x, const BatchNormShape& shape, const float* mean,
                          const float* invstd, const float* weight, const float* bias, float* y,
                          bool relu = false, const float* residual = nullptr);

// Gradients of batch_norm_normalize given gy (N,C,S). With batch_stats the mean and invstd
// were computed from x itself, so gx carries the terms through the statistics:
//   gx = weight*invstd * (gy - mean(gy) - xhat * mean(gy*xhat)),  xhat = (x - mean) * invstd;
// otherwise (eval, running statistics) gx = gy * weight * invstd. gw (C) = sum(gy*xhat),
// gb (C) = sum(gy). Each output may be null; non-null outputs are overwritten.
// relu_out, when not null, is the output of batch_norm_normalize with relu (N,C,S), and gy the
// gradient of that output: gy counts only where relu_out > 0 (ReLU's backward folded in).
// g_residual (N,C,S), when not null, is overwritten with the gradient of the residual added
// before the ReLU: gy where relu_out > 0, else 0 (gy itself without relu_out).
void batch_norm_backward(const float* x, const float* gy, const BatchNormShape& shape,
                         const float* mean, const float* invstd, const float* weight,
                         bool batch_stats, float* gx, float* gw, float* gb,
                         const float* relu_out = nullptr, float* g_residual = nullptr);

}  // namespace hsgd::kernels
