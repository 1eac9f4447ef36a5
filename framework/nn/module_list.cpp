#include "framework/nn/module_list.h"

#include <string>
#include <utility>

#include "comm/error.h"

namespace hsgd::nn {

ModuleList::ModuleList(std::vector<std::shared_ptr<Module>> modules) : Module("ModuleList") {
  for (auto& m : modules) append(std::move(m));
}

void ModuleList::append(std::shared_ptr<Module> module) {
  HSGD_CHECK(module != nullptr, "ModuleList: module ", modules_.size(), " is null");
  modules_.push_back(register_module(std::to_string(modules_.size()), std::move(module)));
}

std::shared_ptr<Module> ModuleList::operator[](size_t i) const {
  HSGD_CHECK(i < modules_.size(), "ModuleList: index ", i, " out of range, size ", modules_.size());
  return modules_[i];
}

}  // namespace hsgd::nn
