#include "optim/adam.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "comm/error.h"
#include "framework/parallel/parallel.h"
#include "framework/tensor/grad_mode.h"

namespace hsgd::optim {
namespace detail {
namespace {

std::string state_key(size_t i, const char* field) {
  return "state." + std::to_string(i) + "." + field;
}

constexpr const char* kOptionNames[] = {"beta1", "beta2", "eps", "amsgrad"};

// Runs of at least this many floats per thread.
constexpr int64_t kUpdateGrain = 32768;

struct Coefficients {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float weight_decay;  // L2 (Adam) or 0
  float decay_factor;  // 1 - lr * weight_decay (AdamW) or 1
  float bias_correction2_sqrt, eps, neg_step_size;
};

// One pass over p, g, m, v (and v_max) per parameter. Each operation is rounded to float in the
// order of the formula in adam.h, as torch's sequence of in-place ops does; every element is
// independent, so the result does not depend on the thread count.
template <bool kAmsgrad>
void fused_update(float* __restrict p, const float* __restrict g, float* __restrict m,
                  float* __restrict v, float* __restrict vmax, int64_t n, const Coefficients& c) {
  parallel_for(0, n, kUpdateGrain, [&, p, g, m, v, vmax](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float d = g[i];
      if (c.weight_decay != 0) d = d + c.weight_decay * p[i];
      float pi = p[i];
      if (c.decay_factor != 1) pi = pi * c.decay_factor;
      const float mi = m[i] * c.beta1 + c.one_minus_beta1 * d;
      const float vi = v[i] * c.beta2 + c.one_minus_beta2 * d * d;
      m[i] = mi;
      v[i] = vi;
      float second = vi;
      if constexpr (kAmsgrad) {
        second = std::max(vmax[i], vi);
        vmax[i] = second;
      }
      const float denom = std::sqrt(second) / c.bias_correction2_sqrt + c.eps;
      p[i] = pi + c.neg_step_size * (mi / denom);
    }
  });
}

// The value of a group option, present after complete_group.
double option(const ParamGroup& group, const char* name) { return group.options.at(name); }

}  // namespace

void AdamState::complete_group(ParamGroup& group, size_t index, const AdamWOptions& defaults,
                               const std::vector<ParamGroup>& existing, const char* who) {
  HSGD_CHECK(!group.momentum && !group.dampening && !group.nesterov, who, ": parameter group ",
             index,
             " sets momentum, dampening or nesterov, which are SGD's; use options beta1/beta2");
  for (const auto& [name, value] : group.options) {
    HSGD_CHECK(
        std::find_if(std::begin(kOptionNames), std::end(kOptionNames),
                     [&](const char* known) { return name == known; }) != std::end(kOptionNames),
        who, ": unknown option '", name, "' = ", value, " in parameter group ", index,
        ", expected one of beta1, beta2, eps, amsgrad");
  }
  if (!group.lr) group.lr = defaults.lr;
  if (!group.weight_decay) group.weight_decay = defaults.weight_decay;
  group.options.try_emplace("beta1", defaults.betas.first);
  group.options.try_emplace("beta2", defaults.betas.second);
  group.options.try_emplace("eps", defaults.eps);
  group.options.try_emplace("amsgrad", defaults.amsgrad ? 1.0 : 0.0);

  HSGD_CHECK(!group.params.empty(), who, ": parameter group ", index, " has no parameters");
  HSGD_CHECK(*group.lr >= 0, who, ": invalid learning rate ", *group.lr, " in group ", index,
             ", expected >= 0");
  HSGD_CHECK(option(group, "eps") >= 0, who, ": invalid eps ", option(group, "eps"), " in group ",
             index, ", expected >= 0");
  for (const char* beta : {"beta1", "beta2"}) {
    const double b = option(group, beta);
    HSGD_CHECK(b >= 0 && b < 1, who, ": invalid ", beta, " ", b, " in group ", index,
               ", expected 0 <= ", beta, " < 1");
  }
  HSGD_CHECK(*group.weight_decay >= 0, who, ": invalid weight_decay ", *group.weight_decay,
             " in group ", index, ", expected >= 0");
  const double amsgrad = option(group, "amsgrad");
  HSGD_CHECK(amsgrad == 0 || amsgrad == 1, who, ": invalid amsgrad ", amsgrad, " in group ", index,
             ", expected 0 or 1");
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    HSGD_CHECK(p.defined(), who, ": parameter ", i, " of group ", index, " is undefined");
    for (size_t j = 0; j < i; ++j) {
      HSGD_CHECK(group.params[j].impl() != p.impl(), who, ": parameter ", i, " of group ", index,
                 " is the same tensor as parameter ", j);
    }
    for (const ParamGroup& other : existing) {
      for (const Tensor& q : other.params) {
        HSGD_CHECK(q.impl() != p.impl(), who, ": parameter ", i, " of group ", index,
                   " already appears in another group");
      }
    }
  }
}

void AdamState::step(std::vector<ParamGroup>& groups, bool decoupled_weight_decay,
                     const char* who) {
  NoGradGuard no_grad;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    ParamGroup& group = groups[gi];
    const double lr = *group.lr, weight_decay = *group.weight_decay;
    const double beta1 = option(group, "beta1"), beta2 = option(group, "beta2");
    const double eps = option(group, "eps");
    const bool amsgrad = option(group, "amsgrad") != 0;
    for (size_t i = 0; i < group.params.size(); ++i) {
      Tensor& p = group.params[i];
      const Tensor grad_in = p.grad();
      if (!grad_in.defined()) continue;
      HSGD_CHECK(grad_in.shape() == p.shape(), who, ": gradient of parameter ", i, " of group ", gi,
                 " has shape ", shape_str(grad_in.shape()), ", expected ", shape_str(p.shape()));
      Slot& s = slots_[gi][i];
      if (s.step == 0) {
        s.exp_avg = zeros(p.shape());
        s.exp_avg_sq = zeros(p.shape());
        if (amsgrad) s.max_exp_avg_sq = zeros(p.shape());
      }
      if (amsgrad && !s.max_exp_avg_sq.defined()) s.max_exp_avg_sq = zeros(p.shape());
      s.step += 1;
      // Scalars in double as torch's Python computes them, rounded once to float.
      const double t = static_cast<double>(s.step);
      const double bias_correction1 = 1 - std::pow(beta1, t);
      const double bias_correction2 = 1 - std::pow(beta2, t);
      const Coefficients c{
          .beta1 = static_cast<float>(beta1),
          .one_minus_beta1 = static_cast<float>(1 - beta1),
          .beta2 = static_cast<float>(beta2),
          .one_minus_beta2 = static_cast<float>(1 - beta2),
          .weight_decay = decoupled_weight_decay ? 0.0f : static_cast<float>(weight_decay),
          .decay_factor = decoupled_weight_decay ? static_cast<float>(1 - lr * weight_decay) : 1.0f,
          .bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2)),
          .eps = static_cast<float>(eps),
          .neg_step_size = static_cast<float>(-(lr / bias_correction1))};
      // The update works on contiguous memory; a non-contiguous parameter (never made by the
      // modules here) is updated through a contiguous copy.
      const Tensor grad = grad_in.contiguous();
      Tensor target = p.is_contiguous() ? p : p.contiguous().clone();
      if (amsgrad) {
        fused_update<true>(target.data(), grad.data(), s.exp_avg.data(), s.exp_avg_sq.data(),
                           s.max_exp_avg_sq.data(), p.numel(), c);
      } else {
        fused_update<false>(target.data(), grad.data(), s.exp_avg.data(), s.exp_avg_sq.data(),
                            nullptr, p.numel(), c);
      }
      if (!p.is_contiguous()) p.copy_(target);
    }
  }
}

void AdamState::save(StateDict& state) const {
  size_t index = 0;
  for (const auto& group : slots_) {
    for (const Slot& s : group) {
      if (s.step > 0) {
        state.set(state_key(index, "step"), s.step);
        state.set(state_key(index, "exp_avg"), s.exp_avg.clone());
        state.set(state_key(index, "exp_avg_sq"), s.exp_avg_sq.clone());
        if (s.max_exp_avg_sq.defined()) {
          state.set(state_key(index, "max_exp_avg_sq"), s.max_exp_avg_sq.clone());
        }
      }
      ++index;
    }
  }
}

void AdamState::check(const StateDict& state, const std::vector<ParamGroup>& groups,
                      const char* who) const {
  // The group layout first, so that the messages below refer to matching groups.
  size_t saved_groups = 0;
  while (state.contains("param_groups." + std::to_string(saved_groups) + ".num_params")) {
    ++saved_groups;
  }
  HSGD_CHECK(saved_groups == groups.size(), who, "::load_state_dict: the state has ", saved_groups,
             " parameter groups, this optimizer ", groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const int64_t n = state.get_int("param_groups." + std::to_string(g) + ".num_params");
    HSGD_CHECK(n == static_cast<int64_t>(groups[g].params.size()), who, "::load_state_dict: group ",
               g, " of the state has ", n, " parameters, this optimizer's ",
               groups[g].params.size());
  }
  size_t index = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string amsgrad_key = "param_groups." + std::to_string(g) + ".options.amsgrad";
    const bool amsgrad = state.contains(amsgrad_key) ? state.get_double(amsgrad_key) != 0
                                                     : option(groups[g], "amsgrad") != 0;
    for (const Tensor& p : groups[g].params) {
      const std::string step_key = state_key(index, "step");
      if (state.contains(step_key)) {
        const int64_t step = state.get_int(step_key);
        HSGD_CHECK(step >= 1, who, "::load_state_dict: '", step_key, "' is ", step,
                   ", expected >= 1");
        std::vector<const char*> fields = {"exp_avg", "exp_avg_sq"};
        if (amsgrad) fields.push_back("max_exp_avg_sq");
        for (const char* field : fields) {
          const std::string key = state_key(index, field);
          HSGD_CHECK(state.contains(key), who, "::load_state_dict: '", key, "' is missing (",
                     step_key, " is ", step, amsgrad ? ", amsgrad group" : "", ")");
          const Tensor t = state.get_tensor(key);
          HSGD_CHECK(t.shape() == p.shape(), who, "::load_state_dict: '", key, "' has shape ",
                     shape_str(t.shape()), ", expected the parameter's shape ",
                     shape_str(p.shape()));
        }
      }
      ++index;
    }
  }
}

void AdamState::load(const StateDict& state) {
  size_t index = 0;
  for (auto& group : slots_) {
    for (Slot& s : group) {
      s = Slot{};
      if (state.contains(state_key(index, "step"))) {
        s.step = state.get_int(state_key(index, "step"));
        s.exp_avg = state.get_tensor(state_key(index, "exp_avg")).clone();
        s.exp_avg_sq = state.get_tensor(state_key(index, "exp_avg_sq")).clone();
        if (state.contains(state_key(index, "max_exp_avg_sq"))) {
          s.max_exp_avg_sq = state.get_tensor(state_key(index, "max_exp_avg_sq")).clone();
        }
      }
      ++index;
    }
  }
}

const AdamState::Slot& AdamState::slot(size_t i, const char* who) const {
  const size_t asked = i;
  for (const auto& group : slots_) {
    if (i < group.size()) return group[i];
    i -= group.size();
  }
  HSGD_THROW(InvalidArgument, who, "::state: parameter index ", asked, " out of range (", asked - i,
             " parameters)");
}

}  // namespace detail

namespace {

AdamWOptions as_adamw(const AdamOptions& o) {
  return {.lr = o.lr,
          .betas = o.betas,
          .eps = o.eps,
          .weight_decay = o.weight_decay,
          .amsgrad = o.amsgrad};
}

}  // namespace

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : Adam(std::vector<ParamGroup>{ParamGroup{.params = std::move(params)}}, options) {}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions options) : defaults_(options) {
  HSGD_CHECK(!groups.empty(), "Adam: got no parameter groups");
  for (ParamGroup& group : groups) add_param_group(std::move(group));
}

void Adam::add_param_group(ParamGroup group) {
  detail::AdamState::complete_group(group, param_groups().size(), as_adamw(defaults_),
                                    param_groups(), "Adam");
  state_.add_group(group.params.size());
  param_groups().push_back(std::move(group));
}

void Adam::step() { state_.step(param_groups(), /*decoupled_weight_decay=*/false, "Adam"); }

StateDict Adam::state_dict() const {
  StateDict state = Optimizer::state_dict();
  state_.save(state);
  return state;
}

void Adam::load_state_dict(const StateDict& state) {
  state_.check(state, param_groups(), "Adam");
  Optimizer::load_state_dict(state);
  state_.load(state);
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : AdamW(std::vector<ParamGroup>{ParamGroup{.params = std::move(params)}}, options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options) : defaults_(options) {
  HSGD_CHECK(!groups.empty(), "AdamW: got no parameter groups");
  for (ParamGroup& group : groups) add_param_group(std::move(group));
}

void AdamW::add_param_group(ParamGroup group) {
  detail::AdamState::complete_group(group, param_groups().size(), defaults_, param_groups(),
                                    "AdamW");
  state_.add_group(group.params.size());
  param_groups().push_back(std::move(group));
}

void AdamW::step() { state_.step(param_groups(), /*decoupled_weight_decay=*/true, "AdamW"); }

StateDict AdamW::state_dict() const {
  StateDict state = Optimizer::state_dict();
  state_.save(state);
  return state;
}

void AdamW::load_state_dict(const StateDict& state) {
  state_.check(state, param_groups(), "AdamW");
  Optimizer::load_state_dict(state);
  state_.load(state);
}

}  // namespace hsgd::optim
