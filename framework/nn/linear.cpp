#include "framework/nn/linear.h"

#include "comm/error.h"
#include "framework/nn/init.h"
#include "framework/tensor/ops.h"

namespace hsgd::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : Module("Linear"), in_features_(in_features), out_features_(out_features) {
  with_default_generator([&](Generator& gen) { reset_parameters(bias, gen); });
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Generator& gen)
    : Module("Linear"), in_features_(in_features), out_features_(out_features) {
  reset_parameters(bias, gen);
}

void Linear::reset_parameters(bool bias, Generator& gen) {
  HSGD_CHECK(in_features_ > 0 && out_features_ > 0, "Linear: in_features ", in_features_,
             " and out_features ", out_features_, " must be positive");
  weight_ = register_parameter(
      "weight", init::default_uniform({out_features_, in_features_}, in_features_, gen));
  if (bias) {
    bias_ = register_parameter("bias", init::default_uniform({out_features_}, in_features_, gen));
  }
}

Tensor Linear::forward(const Tensor& x) {
  HSGD_CHECK(x.defined() && x.dim() >= 1, "Linear: input must have at least one dimension");
  HSGD_CHECK(x.size(-1) == in_features_, "Linear: input has ", x.size(-1), " features (shape ",
             shape_str(x.shape()), "), expected in_features = ", in_features_);
  return linear(x, weight_, bias_);
}

}  // namespace hsgd::nn
