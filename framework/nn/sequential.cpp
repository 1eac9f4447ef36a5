#include "framework/nn/sequential.h"

#include <string>

#include "comm/error.h"

namespace hsgd::nn {

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) : Module("Sequential") {
  for (auto& m : modules) append(std::move(m));
}

void Sequential::append(std::shared_ptr<Module> module) {
  modules_.push_back(register_module(std::to_string(modules_.size()), std::move(module)));
}

Tensor Sequential::forward(const IndexTensor& ids) {
  HSGD_CHECK(!modules_.empty(), "Sequential: forward of ids through an empty Sequential");
  Tensor y = modules_.front()->forward(ids);
  for (size_t i = 1; i < modules_.size(); ++i) y = modules_[i]->forward(y);
  return y;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& m : modules_) y = m->forward(y);
  return y;
}

std::shared_ptr<Module> Sequential::operator[](size_t i) const {
  HSGD_CHECK_LT(i, modules_.size(), "Sequential: index out of range");
  return modules_[i];
}

}  // namespace hsgd::nn
