#pragma once
// nn::BatchNorm2d and nn::BatchNorm1d: batch normalisation over the channels (dim 1) of
// (N,C,H,W) inputs, respectively (N,C) or (N,C,L) inputs, as torch.nn.BatchNorm2d / BatchNorm1d
// (num_features, eps, momentum) with affine=True, track_running_stats=True.
//
// Parameters weight (C) = 1 and bias (C) = 0. Buffers running_mean (C) = 0, running_var (C) = 1
// and num_batches_tracked (a 0-d count stored as float, since tensors are float32).
// In training mode forward normalises with batch statistics and updates the running statistics
// in place (running = (1 - momentum) * running + momentum * batch, unbiased variance) and counts
// the batch; in eval mode it normalises with the running statistics. Training needs more than
// one value per channel (N > 1 for (N,C)), as torch.
//
// Usage:
//   auto bn = std::make_shared<nn::BatchNorm2d>(16);
//   Tensor out = bn->forward(x);      // x (N,16,H,W)
//   Tensor z = bn->forward_relu(x);   // relu(bn->forward(x)) in one pass
//   Tensor r = bn->forward_add_relu(x, out);   // relu(bn->forward(x) + out), one pass
//   bn->eval();
//   auto bn1 = std::make_shared<nn::BatchNorm1d>(64);
//   Tensor h = bn1->forward(randn({32, 64}, gen));   // (N,C); (N,C,L) normalises over N and L

#include <cstdint>

#include "framework/nn/module.h"

namespace hsgd::nn {

// What BatchNorm1d and BatchNorm2d share: the checked options, the parameters and buffers in
// torch's order, and the normalisation of an input whose shape the subclass checked.
class BatchNormBase : public Module {
 public:
  int64_t num_features() const { return num_features_; }
  Tensor weight() const { return weight_; }
  Tensor bias() const { return bias_; }
  Tensor running_mean() const { return running_mean_; }
  Tensor running_var() const { return running_var_; }
  Tensor num_batches_tracked() const { return num_batches_tracked_; }

 protected:
  // name ("BatchNorm2d") names the module and starts every error message. InvalidArgument for
  // num_features <= 0, eps <= 0 or a momentum outside [0, 1].
  BatchNormBase(const char* name, int64_t num_features, double eps, double momentum);
  // x (N,C,...), its rank checked by the subclass: checks C == num_features (naming the shape),
  // normalises (adding residual when it is defined, then a fused relu when relu) and counts the
  // batch in training mode.
  Tensor normalize(const Tensor& x, bool relu, const Tensor& residual = Tensor());

 private:
  int64_t num_features_;
  double eps_;
  double momentum_;
  Tensor weight_, bias_;                                     // (C)
  Tensor running_mean_, running_var_, num_batches_tracked_;  // (C), (C), 0-d
};

class BatchNorm2d : public BatchNormBase {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1);

  Tensor forward(const Tensor& x) override;
  // relu(forward(x)), computed in one pass (batch_norm_relu): a fusion for models, same results.
  Tensor forward_relu(const Tensor& x);
  // relu(forward(x) + residual) in one pass (batch_norm_add_relu), residual of x's shape.
  Tensor forward_add_relu(const Tensor& x, const Tensor& residual);

 private:
  void check_input(const Tensor& x) const;
};

class BatchNorm1d : public BatchNormBase {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, double momentum = 0.1);

  // x (N,C) or (N,C,L) -> the same shape. InvalidArgument naming the shape for another rank or
  // a channel count other than num_features.
  Tensor forward(const Tensor& x) override;
};

}  // namespace hsgd::nn
