#pragma once
// make_model: builds one of the bundled models by name, so that programs and benchmarks can take
// the architecture as a flag (--model resnet20).
//
//   "mlp"       models::MLP    numel(input_shape) -> mlp_hidden... -> num_classes
//   "resnet20"  models::ResNet CIFAR ResNet-20 (272,474 parameters at 10 classes)
//   "resnet32"  models::ResNet CIFAR ResNet-32
//   "resnet56"  models::ResNet CIFAR ResNet-56
//   "resnet18"  models::ResNet ResNet-18, CIFAR variant (11,173,962 parameters at 10 classes)
//
// Usage:
//   auto model = models::make_model("resnet20", {.num_classes = 10, .seed = 1});
//   auto mlp = models::make_model("mlp", {.input_shape = {1, 28, 28}});
//
// Errors: an unknown name throws InvalidArgument listing the known names; invalid options throw
// what the model's constructor throws.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "framework/nn/module.h"

namespace hsgd::models {

struct ModelOptions {
  int64_t num_classes = 10;
  // One example without the batch dimension: (C,H,W) for the ResNets (C is their in_channels,
  // H and W are free); the MLP flattens it.
  Shape input_shape = {3, 32, 32};
  uint64_t seed = 0;
  std::vector<int64_t> mlp_hidden = {512, 256};  // hidden layer sizes of "mlp"
};

// The names make_model accepts, in the order above.
const std::vector<std::string>& model_names();

std::shared_ptr<nn::Module> make_model(const std::string& name, const ModelOptions& options = {});

}  // namespace hsgd::models
