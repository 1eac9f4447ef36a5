#include "framework/train/optimizer.h"

#include "comm/error.h"

namespace hsgd {
namespace {

std::string group_key(size_t g, const std::string& field) {
  return "param_groups." + std::to_string(g) + "." + field;
}

}  // namespace

Optimizer::Optimizer(std::vector<ParamGroup> param_groups)
    : param_groups_(std::move(param_groups)) {}

void Optimizer::zero_grad() {
  for (ParamGroup& group : param_groups()) {
    for (Tensor& p : group.params) {
      Tensor g = p.grad();
      if (g.defined()) g.zero_();
    }
  }
}

StateDict Optimizer::state_dict() const {
  StateDict state;
  const std::vector<ParamGroup>& groups = param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const ParamGroup& group = groups[g];
    state.set(group_key(g, "num_params"), static_cast<int64_t>(group.params.size()));
    if (group.lr) state.set(group_key(g, "lr"), *group.lr);
    if (group.momentum) state.set(group_key(g, "momentum"), *group.momentum);
    if (group.dampening) state.set(group_key(g, "dampening"), *group.dampening);
    if (group.weight_decay) state.set(group_key(g, "weight_decay"), *group.weight_decay);
    if (group.nesterov) state.set(group_key(g, "nesterov"), int64_t{*group.nesterov});
    for (const auto& [name, value] : group.options)
      state.set(group_key(g, "options." + name), value);
  }
  return state;
}

void Optimizer::load_state_dict(const StateDict& state) {
  std::vector<ParamGroup>& groups = param_groups();
  // Validate first so that a mismatching state leaves the optimizer untouched.
  size_t saved_groups = 0;
  while (state.contains(group_key(saved_groups, "num_params"))) ++saved_groups;
  HSGD_CHECK_EQ(
      saved_groups, groups.size(),
      "Optimizer::load_state_dict: number of param groups in the state vs this optimizer");
  for (size_t g = 0; g < groups.size(); ++g) {
    HSGD_CHECK_EQ(
        state.get_int(group_key(g, "num_params")), static_cast<int64_t>(groups[g].params.size()),
        "Optimizer::load_state_dict: parameters in group ", g, " of the state vs this optimizer");
    for (const char* field : {"lr", "momentum", "dampening", "weight_decay"}) {
      if (state.contains(group_key(g, field))) state.get_double(group_key(g, field));
    }
    if (state.contains(group_key(g, "nesterov"))) state.get_int(group_key(g, "nesterov"));
  }
  const std::string options_infix = "options.";
  for (size_t g = 0; g < groups.size(); ++g) {
    ParamGroup& group = groups[g];
    auto load = [&](const char* field, std::optional<double>& dst) {
      if (state.contains(group_key(g, field))) dst = state.get_double(group_key(g, field));
    };
    load("lr", group.lr);
    load("momentum", group.momentum);
    load("dampening", group.dampening);
    load("weight_decay", group.weight_decay);
    if (state.contains(group_key(g, "nesterov"))) {
      group.nesterov = state.get_int(group_key(g, "nesterov")) != 0;
    }
    const std::string prefix = group_key(g, options_infix);
    for (const auto& [key, value] : state.entries()) {
      if (key.rfind(prefix, 0) == 0) {
        group.options[key.substr(prefix.size())] = state.get_double(key);
      }
    }
  }
}

}  // namespace hsgd
