#include "optim/sgd.h"

#include <string>

#include "comm/error.h"
#include "framework/parallel/parallel.h"
#include "framework/tensor/grad_mode.h"

namespace hsgd::optim {
namespace {

std::string state_key(size_t i) { return "state." + std::to_string(i) + ".momentum_buffer"; }

struct Coefficients {
  float lr, momentum, one_minus_dampening, weight_decay;
  bool nesterov;
};

// Runs of at least this many floats per thread (smaller ones cost more to hand out than to
// update).
constexpr int64_t kUpdateGrain = 32768;

// The whole update of one parameter in one pass over p, g and buf (buf null without momentum),
// instead of five passes and a copy of g. Each product and sum is rounded to float in the order
// of the step-by-step form in sgd.h (the code is built without FMA contraction), so the result
// is bit-identical to it. Every element is independent: the same at every thread count.
template <bool kDecay, bool kMomentum, bool kNesterov>
void fused_update(float* __restrict p, const float* __restrict g, float* __restrict buf, int64_t n,
                  const Coefficients& c) {
  parallel_for(0, n, kUpdateGrain, [&, p, g, buf](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float d = g[i];
      if constexpr (kDecay) d = d + c.weight_decay * p[i];
      if constexpr (kMomentum) {
        float b = buf[i] * c.momentum;
        b = b + c.one_minus_dampening * d;
        buf[i] = b;
        d = kNesterov ? d + c.momentum * b : b;
      }
      p[i] = p[i] + -c.lr * d;
    }
  });
}

void fused_update(Tensor& p, const Tensor& g, Tensor* buf, const Coefficients& c) {
  float* b = buf == nullptr ? nullptr : buf->data();
  const int64_t n = p.numel();
  const bool decay = c.weight_decay != 0;
  if (b == nullptr) {
    decay ? fused_update<true, false, false>(p.data(), g.data(), b, n, c)
          : fused_update<false, false, false>(p.data(), g.data(), b, n, c);
  } else if (c.nesterov) {
    decay ? fused_update<true, true, true>(p.data(), g.data(), b, n, c)
          : fused_update<false, true, true>(p.data(), g.data(), b, n, c);
  } else {
    decay ? fused_update<true, true, false>(p.data(), g.data(), b, n, c)
          : fused_update<false, true, false>(p.data(), g.data(), b, n, c);
  }
}

// Whether the fused update applies: one shape, contiguous storage, and (with momentum) a buffer
// from an earlier step; the first step with momentum copies g into the buffer instead.
bool fusable(const Tensor& p, const Tensor& g, const Tensor* buf) {
  const auto plain = [&](const Tensor& t) { return t.shape() == p.shape() && t.is_contiguous(); };
  return plain(p) && plain(g) && (buf == nullptr || (buf->defined() && plain(*buf)));
}

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
      Tensor* buf = momentum != 0 ? &buffers_[gi][i] : nullptr;
      if (fusable(p, grad, buf)) {
        fused_update(p, grad, buf,
                     {.lr = lr,
                      .momentum = momentum,
                      .one_minus_dampening = one_minus_dampening,
                      .weight_decay = weight_decay,
                      .nesterov = *group.nesterov});
        continue;
      }
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
