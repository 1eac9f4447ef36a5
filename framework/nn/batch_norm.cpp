#include "framework/nn/batch_norm.h"

#include "comm/error.h"
#include "framework/tensor/nn_ops.h"

namespace hsgd::nn {

BatchNormBase::BatchNormBase(const char* name, int64_t num_features, double eps, double momentum)
    : Module(name), num_features_(num_features), eps_(eps), momentum_(momentum) {
  HSGD_CHECK(num_features > 0, name, ": num_features ", num_features, " must be positive");
  HSGD_CHECK(eps > 0, name, ": eps ", eps, " must be positive");
  HSGD_CHECK(momentum >= 0 && momentum <= 1, name, ": momentum ", momentum, " must be in [0, 1]");
  weight_ = register_parameter("weight", ones({num_features}));
  bias_ = register_parameter("bias", zeros({num_features}));
  running_mean_ = register_buffer("running_mean", zeros({num_features}));
  running_var_ = register_buffer("running_var", ones({num_features}));
  num_batches_tracked_ = register_buffer("num_batches_tracked", zeros({}));
}

Tensor BatchNormBase::normalize(const Tensor& x, bool relu, const Tensor& residual) {
  HSGD_CHECK(x.size(1) == num_features_, type_name(), ": input has ", x.size(1),
             " channels (shape ", shape_str(x.shape()),
             "), expected num_features = ", num_features_);
  Tensor y = residual.defined() ? batch_norm_add_relu(x, residual, weight_, bias_, running_mean_,
                                                      running_var_, is_training(), momentum_, eps_)
                                : (relu ? batch_norm_relu : batch_norm)(
                                      x, weight_, bias_, running_mean_, running_var_, is_training(),
                                      momentum_, eps_);
  if (is_training()) num_batches_tracked_.data()[0] += 1.0f;
  return y;
}

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, double momentum)
    : BatchNormBase("BatchNorm2d", num_features, eps, momentum) {}

void BatchNorm2d::check_input(const Tensor& x) const {
  HSGD_CHECK(x.defined() && x.dim() == 4, "BatchNorm2d: input must be (N,C,H,W), got shape ",
             x.defined() ? shape_str(x.shape()) : "undefined");
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  check_input(x);
  return normalize(x, false);
}

Tensor BatchNorm2d::forward_relu(const Tensor& x) {
  check_input(x);
  return normalize(x, true);
}

Tensor BatchNorm2d::forward_add_relu(const Tensor& x, const Tensor& residual) {
  check_input(x);
  return normalize(x, true, residual);
}

BatchNorm1d::BatchNorm1d(int64_t num_features, double eps, double momentum)
    : BatchNormBase("BatchNorm1d", num_features, eps, momentum) {}

Tensor BatchNorm1d::forward(const Tensor& x) {
  HSGD_CHECK(x.defined() && (x.dim() == 2 || x.dim() == 3),
             "BatchNorm1d: input must be (N,C) or (N,C,L), got shape ",
             x.defined() ? shape_str(x.shape()) : "undefined");
  return normalize(x, false);
}

}  // namespace hsgd::nn
