#pragma once
// Parameter-free layers: ReLU, GELU, SiLU, Flatten.
//
// Usage:
//   auto net = std::make_shared<nn::Sequential>();
//   net->push_back(std::make_shared<nn::Flatten>());      // (N,1,28,28) -> (N,784)
//   net->push_back(std::make_shared<nn::ReLU>());
//   net->push_back(std::make_shared<nn::GELU>(nn::GELUOptions{.approximate = "tanh"}));
//   net->push_back(std::make_shared<nn::SiLU>());

#include <cstdint>
#include <string>

#include "framework/nn/module.h"

namespace hsgd::nn {

// y = max(x, 0) elementwise.
class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override;
};

struct GELUOptions {
  // "none": x * Phi(x) with the exact normal CDF (erf); "tanh": torch's tanh approximation.
  std::string approximate = "none";
};

// torch.nn.GELU: gelu(x) elementwise (framework/tensor/nn_ops.h). The constructor throws
// InvalidArgument naming the value when approximate is neither "none" nor "tanh".
class GELU : public Module {
 public:
  explicit GELU(GELUOptions options = {});
  Tensor forward(const Tensor& x) override;
  const std::string& approximate() const { return approximate_; }

 private:
  std::string approximate_;
};

// torch.nn.SiLU: x * sigmoid(x) elementwise.
class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& x) override;
};

// Merges dimensions start_dim..end_dim (torch's defaults: 1..-1, i.e. keep the batch dim).
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : Module("Flatten"), start_dim_(start_dim), end_dim_(end_dim) {}
  Tensor forward(const Tensor& x) override;

 private:
  int64_t start_dim_;
  int64_t end_dim_;
};

}  // namespace hsgd::nn
