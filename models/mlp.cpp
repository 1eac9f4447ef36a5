#include "models/mlp.h"

#include <string>

#include "comm/error.h"
#include "framework/tensor/ops.h"

namespace hsgd::models {

MLP::MLP(const MLPOptions& options) : Module("MLP") {
  const std::vector<int64_t>& sizes = options.sizes;
  HSGD_CHECK(sizes.size() >= 2, "MLP: sizes must list at least the input and output sizes, got ",
             sizes.size(), " values");
  for (int64_t s : sizes) HSGD_CHECK(s > 0, "MLP: layer size ", s, " must be positive");
  Generator gen(options.seed);
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    layers_.push_back(
        register_module("fc" + std::to_string(i + 1),
                        std::make_shared<nn::Linear>(sizes[i], sizes[i + 1], /*bias=*/true, gen)));
  }
}

Tensor MLP::forward(const Tensor& x) {
  HSGD_CHECK(x.defined() && x.dim() >= 2, "MLP: input must be (N, features...), got shape ",
             x.defined() ? shape_str(x.shape()) : "undefined");
  Tensor h = x.dim() == 2 ? x : x.flatten(1);
  for (size_t i = 0; i < layers_.size(); ++i) {
    h = layers_[i]->forward(h);
    if (i + 1 < layers_.size()) h = relu(h);
  }
  return h;
}

}  // namespace hsgd::models
