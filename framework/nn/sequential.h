#pragma once
// nn::Sequential: runs its modules in order, output of one is input of the next. Modules are
// registered under their position ("0", "1", ...), as in torch.nn.Sequential, so a parameter is
// called "2.weight" in both frameworks and golden state dicts load unchanged.
//
// Usage:
//   auto net = std::make_shared<nn::Sequential>();
//   net->push_back(std::make_shared<nn::Linear>(784, 256));
//   net->push_back(std::make_shared<nn::ReLU>());
//   net->push_back(std::make_shared<nn::Linear>(256, 10));
//   Tensor logits = net->forward(x);

#include <cstddef>
#include <memory>
#include <vector>

#include "framework/nn/module.h"

namespace hsgd::nn {

class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);

  // Appends module under the name std::to_string(size()); returns it.
  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    append(module);
    return module;
  }

  Tensor forward(const Tensor& x) override;
  // ids through the first module (an Embedding, say), its output through the others.
  Tensor forward(const IndexTensor& ids) override;

  size_t size() const { return modules_.size(); }
  // The i-th module; InvalidArgument when i >= size().
  std::shared_ptr<Module> operator[](size_t i) const;

 private:
  void append(std::shared_ptr<Module> module);

  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace hsgd::nn
