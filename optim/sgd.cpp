#include "optim/sgd.h"

#include <string>

#include "comm/error.h"
#include "framework/tensor/grad_mode.h"

namespace hsgd::optim {
namespace {

std::string state_key(size_t i) { return "state." + std::to_string(i) + ".momentum_buffer"; }

}  // namespace

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : SGD(std::vector<ParamGroup>{ParamGroup{.params = std::move(params)}}, options) {}

SGD::SGD(std::vector<ParamGroup> param_groups, SGDOptions options) : defaults_(options) {
  HSGD_CHECK(!param_groups.empty(), "SGD: got no parameter groups");
  for (ParamGroup& group : param_groups) add_param_group(std::move(group));
}

void SGD::check_group(ParamGroup& group, size_t index) {
  if (!group.lr) group.lr = defaults_.lr;
  if (!group.momentum) group.momentum = defaults_.momentum;
  if (!group.dampening) group.dampening = defaults_.dampening;
  if (!group.weight_decay) group.weight_decay = defaults_.weight_decay;
  if (!group.nesterov) group.nesterov = defaults_.nesterov;
  HSGD_CHECK(!group.params.empty(), "SGD: parameter group ", index, " has no parameters");
  HSGD_CHECK(*group.lr >= 0, "SGD: invalid learning rate ", *group.lr, " in group ", index,
             ", expected >= 0");
  HSGD_CHECK(*group.momentum >= 0, "SGD: invalid momentum ", *group.momentum, " in group ", index,
             ", expected >= 0");
  HSGD_CHECK(*group.weight_decay >= 0, "SGD: invalid weight_decay ", *group.weight_decay,
             " in group ", index, ", expected >= 0");
  HSGD_CHECK(!*group.nesterov || (*group.momentum > 0 && *group.dampening == 0),
             "SGD: nesterov momentum requires momentum > 0 and dampening 0, got momentum ",
             *group.momentum, " and dampening ", *group.dampening, " in group ", index);
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    HSGD_CHECK(p.defined(), "SGD: parameter ", i, " of group ", index, " is undefined");
    for (const ParamGroup& other : param_groups()) {
      for (const Tensor& q : other.params) {
        HSGD_CHECK(q.impl() != p.impl(), "SGD: parameter ", i, " of group ", index,
                   " already appears in another group");
      }
    }
  }
}

void SGD::add_param_group(ParamGroup group) {
  check_group(group, param_groups().size());
  buffers_.emplace_back(group.params.size());
  param_groups().push_back(std::move(group));
}

void SGD::step() {
  NoGradGuard no_grad;
  std::vector<ParamGroup>& groups = param_groups();
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    ParamGroup& group = groups[gi];
    const float lr = static_cast<float>(*group.lr);
    const float momentum = static_cast<float>(*group.momentum);
    // 1 - dampening in double then rounded once, as torch passes alpha.
    const float one_minus_dampening = static_cast<float>(1.0 - *group.dampening);
    const float weight_decay = static_cast<float>(*group.weight_decay);
    for (size_t i = 0; i < group.params.size(); ++i) {
      Tensor& p = group.params[i];
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      Tensor d_p = grad;
      if (weight_decay != 0) d_p = grad.clone().add_(p, weight_decay);
      if (momentum != 0) {
        Tensor& buf = buffers_[gi][i];
        if (!buf.defined()) {
          buf = d_p.clone();
        } else {
          buf.mul_(momentum).add_(d_p, one_minus_dampening);
        }
        if (*group.nesterov) {
          // A fresh tensor: d_p may still alias the gradient.
          d_p = (weight_decay != 0 ? d_p : d_p.clone()).add_(buf, momentum);
        } else {
          d_p = buf;
        }
      }
      p.add_(d_p, -lr);
    }
  }
}

Tensor SGD::momentum_buffer(size_t i) const {
  for (const auto& group : buffers_) {
    if (i < group.size()) return group[i];
    i -= group.size();
  }
  HSGD_THROW(InvalidArgument, "SGD::momentum_buffer: parameter index out of range");
}

StateDict SGD::state_dict() const {
  StateDict state = Optimizer::state_dict();
  size_t index = 0;
  for (const auto& group : buffers_) {
    for (const Tensor& buf : group) {
      if (buf.defined()) state.set(state_key(index), buf.clone());
      ++index;
    }
  }
  return state;
}

void SGD::load_state_dict(const StateDict& state) {
  // Check the buffers against the parameter shapes before anything changes.
  size_t index = 0;
  for (const ParamGroup& group : param_groups()) {
    for (const Tensor& p : group.params) {
      if (state.contains(state_key(index))) {
        const Tensor buf = state.get_tensor(state_key(index));
        HSGD_CHECK(buf.shape() == p.shape(), "SGD::load_state_dict: '", state_key(index),
                   "' has shape ", shape_str(buf.shape()), ", expected the parameter's shape ",
                   shape_str(p.shape()));
      }
      ++index;
    }
  }
  Optimizer::load_state_dict(state);
  index = 0;
  for (auto& group : buffers_) {
    for (Tensor& buf : group) {
      buf =
          state.contains(state_key(index)) ? state.get_tensor(state_key(index)).clone() : Tensor();
      ++index;
    }
  }
}

}  // namespace hsgd::optim
