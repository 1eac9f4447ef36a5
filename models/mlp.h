#pragma once
// models::MLP: a multi-layer perceptron. sizes {784, 512, 256, 10} builds
//   Flatten -> Linear(784,512) -> ReLU -> Linear(512,256) -> ReLU -> Linear(256,10)
// with the linear layers registered as "fc1", "fc2", "fc3" (parameters "fc1.weight", ...). The
// input is flattened from dim 1, so (N,1,28,28) and (N,784) both work; the output is logits.
// Weights use PyTorch's default initialisation drawn from Generator(seed): the same seed gives
// the same model on every process.
//
// Usage:
//   auto model = std::make_shared<models::MLP>(models::MLPOptions{.sizes = {784, 512, 256, 10}});
//   Tensor logits = model->forward(batch.inputs);
//
// Errors: fewer than two sizes or a non-positive size throw InvalidArgument.

#include <cstdint>
#include <memory>
#include <vector>

#include "framework/nn/linear.h"
#include "framework/nn/module.h"

namespace hsgd::models {

struct MLPOptions {
  std::vector<int64_t> sizes = {784, 512, 256, 10};
  uint64_t seed = 0;
};

class MLP : public nn::Module {
 public:
  explicit MLP(const MLPOptions& options = {});
  // x (N, ...) with prod(...) == sizes.front() -> logits (N, sizes.back())
  Tensor forward(const Tensor& x) override;

  const std::vector<std::shared_ptr<nn::Linear>>& layers() const { return layers_; }

 private:
  std::vector<std::shared_ptr<nn::Linear>> layers_;
};

}  // namespace hsgd::models
