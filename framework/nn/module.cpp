#include "framework/nn/module.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "comm/error.h"
#include "framework/tensor/grad_mode.h"

namespace hsgd::nn {

Tensor find_tensor(const NamedTensors& named, const std::string& name) {
  for (const auto& [key, t] : named) {
    if (key == name) return t;
  }
  return Tensor();
}

Module::Module(std::string type_name)
    : type_name_(std::move(type_name)), tree_seed_(initial_seed()) {}

Tensor Module::forward(const Tensor&) {
  HSGD_THROW(Error, type_name_, " does not implement forward(const Tensor&)");
}

Tensor Module::forward(const IndexTensor& ids) {
  HSGD_THROW(Error, type_name_, " takes float inputs, not ids: it does not implement ",
             "forward(const IndexTensor&) (got ids of shape ", shape_str(ids.shape()), ")");
}

void Module::check_new_name(const std::string& name, const char* what) const {
  HSGD_CHECK(!name.empty(), type_name_, ": ", what, " name must not be empty");
  HSGD_CHECK(name.find('.') == std::string::npos, type_name_, ": ", what, " name '", name,
             "' must not contain '.'");
  const bool taken = find_tensor(parameters_, name).defined() ||
                     find_tensor(buffers_, name).defined() ||
                     std::any_of(children_.begin(), children_.end(),
                                 [&](const auto& c) { return c.first == name; }) ||
                     std::any_of(generators_.begin(), generators_.end(),
                                 [&](const auto& g) { return g.name == name; });
  HSGD_CHECK(!taken, type_name_, ": ", what, " name '", name, "' is already registered");
}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  check_new_name(name, "parameter");
  HSGD_CHECK(t.defined(), type_name_, ": parameter '", name, "' is an undefined tensor");
  t.set_requires_grad(true);
  parameters_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_new_name(name, "buffer");
  HSGD_CHECK(t.defined(), type_name_, ": buffer '", name, "' is an undefined tensor");
  buffers_.emplace_back(name, t);
  return t;
}

Generator& Module::register_generator(const std::string& name, Generator& gen,
                                      GeneratorSeed seeding) {
  check_new_name(name, "generator");
  generators_.push_back({name, &gen, seeding});
  if (seeding == GeneratorSeed::kFromTree) gen.seed(derive_seed(tree_seed_, name));
  return gen;
}

void Module::register_module_impl(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name, "submodule");
  HSGD_CHECK(module != nullptr, type_name_, ": submodule '", name, "' is null");
  // This module is the root of the tree for now; registering it into a parent derives again.
  module->derive_generators(tree_seed_, name + ".");
  children_.emplace_back(name, std::move(module));
}

void Module::derive_generators(uint64_t seed, std::string prefix) {
  if (seed_pinned_) {
    seed = tree_seed_;
    prefix.clear();
  }
  for (const RegisteredGenerator& g : generators_) {
    if (g.seeding == GeneratorSeed::kFromTree)
      g.generator->seed(derive_seed(seed, prefix + g.name));
  }
  for (const auto& [name, child] : children_) child->derive_generators(seed, prefix + name + ".");
}

void Module::seed_generators(uint64_t seed) {
  for (const auto& [name, child] : children_) child->unpin_seeds();
  tree_seed_ = seed;
  seed_pinned_ = true;
  derive_generators(seed, "");
}

void Module::unpin_seeds() {
  seed_pinned_ = false;
  for (const auto& [name, child] : children_) child->unpin_seeds();
}

void Module::collect(const std::string& prefix, bool recurse, bool buffers,
                     NamedTensors& out) const {
  for (const auto& [name, t] : buffers ? buffers_ : parameters_) out.emplace_back(prefix + name, t);
  if (!recurse) return;
  for (const auto& [name, child] : children_)
    child->collect(prefix + name + ".", true, buffers, out);
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors out;
  collect("", recurse, false, out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  collect("", recurse, true, out);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [name, child] : children_) out.push_back(child);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out = {{"", this}};
  for (const auto& [name, child] : children_) {
    for (auto& [sub, m] : child->named_modules()) {
      out.emplace_back(sub.empty() ? name : name + "." + sub, m);
    }
  }
  return out;
}

std::vector<std::pair<std::string, Generator*>> Module::named_generators() {
  std::vector<std::pair<std::string, Generator*>> out;
  for (const RegisteredGenerator& g : generators_) out.emplace_back(g.name, g.generator);
  for (const auto& [name, child] : children_) {
    for (auto& [sub, gen] : child->named_generators()) out.emplace_back(name + "." + sub, gen);
  }
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::zero_grad() {
  for (auto& p : parameters()) {
    Tensor g = p.grad();
    if (g.defined()) g.zero_();
  }
}

void Module::collect_state(const std::string& prefix, NamedTensors& out) const {
  for (const auto& [name, t] : parameters_) out.emplace_back(prefix + name, t);
  for (const auto& [name, t] : buffers_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect_state(prefix + name + ".", out);
}

NamedTensors Module::state_dict() const {
  NamedTensors out;
  collect_state("", out);
  return out;
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  const NamedTensors own = state_dict();
  // Validate everything first so that a bad state dict leaves the module untouched.
  std::set<std::string> seen;
  for (const auto& [key, src] : state) {
    HSGD_CHECK(seen.insert(key).second, type_name_, "::load_state_dict: key '", key,
               "' appears twice");
    const Tensor dst = find_tensor(own, key);
    if (!dst.defined()) {
      HSGD_CHECK(!strict, type_name_, "::load_state_dict: unexpected key '", key,
                 "' (not a parameter or buffer of this module)");
      continue;
    }
    HSGD_CHECK(src.defined(), type_name_, "::load_state_dict: key '", key,
               "' holds an undefined tensor");
    HSGD_CHECK(src.shape() == dst.shape(), type_name_, "::load_state_dict: key '", key,
               "' has shape ", shape_str(src.shape()), ", expected ", shape_str(dst.shape()));
  }
  if (strict) {
    for (const auto& [key, dst] : own) {
      HSGD_CHECK(seen.count(key) == 1, type_name_, "::load_state_dict: missing key '", key,
                 "' of shape ", shape_str(dst.shape()));
    }
  }
  NoGradGuard no_grad;
  for (const auto& [key, src] : state) {
    Tensor dst = find_tensor(own, key);
    if (dst.defined()) dst.copy_(src);
  }
}

void Module::describe(const std::string& name, int indent, std::string& out) const {
  std::ostringstream line;
  line << std::string(static_cast<size_t>(indent) * 2, ' ') << (name.empty() ? "" : name + ": ")
       << type_name_;
  for (const auto& [pname, t] : parameters_) line << " " << pname << shape_str(t.shape());
  out += line.str() + "\n";
  for (const auto& [cname, child] : children_) child->describe(cname, indent + 1, out);
}

std::string Module::to_string() const {
  std::string out;
  describe("", 0, out);
  return out;
}

}  // namespace hsgd::nn
