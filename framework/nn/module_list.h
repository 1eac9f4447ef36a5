#pragma once
// nn::ModuleList: holds submodules in a list, as torch.nn.ModuleList. Modules are registered
// under their position ("0", "1", ...), so named_parameters() reports "0.weight", "1.bias", ...
// (and "blocks.0.weight" when the list is registered as "blocks"), exactly as torch names them.
// Unlike Sequential it has no forward: the owner decides how the modules are called.
//
// Usage:
//   auto blocks = std::make_shared<nn::ModuleList>();
//   for (int i = 0; i < 4; ++i) blocks->push_back(std::make_shared<nn::Linear>(64, 64));
//   Tensor h = x;
//   for (size_t i = 0; i < blocks->size(); ++i) h = relu((*blocks)[i]->forward(h));
//   for (const auto& block : *blocks) block->eval();
//
// Errors: a null module, or an index >= size(), throws InvalidArgument.

#include <cstddef>
#include <memory>
#include <vector>

#include "framework/nn/module.h"

namespace hsgd::nn {

class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  explicit ModuleList(std::vector<std::shared_ptr<Module>> modules);

  // Appends module under the name std::to_string(size()); returns it.
  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    append(module);
    return module;
  }

  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  // The i-th module; InvalidArgument when i >= size().
  std::shared_ptr<Module> operator[](size_t i) const;
  // The i-th module as M (null when it is not an M); InvalidArgument when i >= size().
  template <typename M>
  std::shared_ptr<M> get(size_t i) const {
    return std::dynamic_pointer_cast<M>((*this)[i]);
  }

  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return modules_.begin(); }
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return modules_.end(); }

 private:
  void append(std::shared_ptr<Module> module);

  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace hsgd::nn
