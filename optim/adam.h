#pragma once
// optim::Adam and optim::AdamW, exactly as torch.optim.Adam / torch.optim.AdamW in PyTorch 1.13
// (maximize=False, the single-tensor path). For each parameter p with a defined gradient g, per
// step, with t counting that parameter's steps from 1:
//   Adam:  g = g + weight_decay * p                         (L2 penalty, if weight_decay != 0)
//   AdamW: p = p * (1 - lr * weight_decay)                  (decoupled weight decay)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   amsgrad: v_max = max(v_max, v), and v_max replaces v below
//   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// m, v (and v_max) start at zero. A parameter whose gradient is undefined is skipped: its t, m
// and v stay as they are (as torch, whose state is per parameter).
//
// Param groups: lr and weight_decay are the ParamGroup fields; betas, eps and amsgrad are
// ParamGroup::options "beta1", "beta2", "eps" and "amsgrad" (0 or 1). A field or option a group
// leaves out takes the value of the options given to the constructor, as a key missing from a
// torch param-group dict does. momentum, dampening, nesterov and other option names are errors.
//
// Usage:
//   optim::AdamW opt(model->parameters(), {.lr = 4e-4, .weight_decay = 0.1});
//   opt.zero_grad();
//   loss.backward();
//   opt.step();
//   // groups: no decay for the first group, other betas for the second:
//   std::vector<Tensor> decay = model->parameters(), no_decay;
//   optim::Adam grouped({{.params = decay, .options = {{"beta1", 0.8}, {"amsgrad", 1}}},
//                        {.params = no_decay, .weight_decay = 0}},
//                       optim::AdamOptions{.lr = 1e-3, .weight_decay = 1e-4});
//
// Errors (InvalidArgument naming the value and the group): lr < 0, eps < 0, a beta outside
// [0, 1), weight_decay < 0, amsgrad not 0 or 1, an unknown option, an SGD field (momentum,
// dampening, nesterov) set, no groups, an empty group, an undefined parameter, a parameter in two
// groups.
//
// state_dict(): the base class's group entries (lr, weight_decay, options.{beta1,beta2,eps,
// amsgrad}) plus, for every parameter i (numbered across groups in order, as torch does) that
// has taken a step, "state.<i>.step" (int64) and copies "state.<i>.exp_avg", "state.<i>.exp_avg_sq"
// and, with amsgrad, "state.<i>.max_exp_avg_sq" (torch's names). load_state_dict checks every
// shape and that an amsgrad group's stepped parameters have max_exp_avg_sq before changing
// anything.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "framework/train/optimizer.h"

namespace hsgd::optim {

struct AdamOptions {
  double lr = 1e-3;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
};

struct AdamWOptions {
  double lr = 1e-3;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
};

namespace detail {

// The state and update shared by Adam and AdamW (they differ only in where weight decay goes).
// Not for direct use.
class AdamState {
 public:
  struct Slot {
    int64_t step = 0;  // 0: no step taken yet, the tensors are undefined
    Tensor exp_avg, exp_avg_sq, max_exp_avg_sq;
  };

  // Fills the group's missing hyper-parameters from the defaults and validates them; `who` is
  // "Adam" or "AdamW" for messages. Checks the parameters against `existing` groups.
  static void complete_group(ParamGroup& group, size_t index, const AdamWOptions& defaults,
                             const std::vector<ParamGroup>& existing, const char* who);
  void add_group(size_t num_params) { slots_.emplace_back(num_params); }
  void step(std::vector<ParamGroup>& groups, bool decoupled_weight_decay, const char* who);
  void save(StateDict& state) const;
  // Validates state against the groups (their number and sizes, the tensors' shapes, the
  // entries an amsgrad group needs); `who` names the optimizer in messages.
  void check(const StateDict& state, const std::vector<ParamGroup>& groups, const char* who) const;
  // Replaces every slot with the state's (after check).
  void load(const StateDict& state);
  // The slot of the i-th parameter counted across groups; InvalidArgument when out of range.
  const Slot& slot(size_t i, const char* who) const;

 private:
  std::vector<std::vector<Slot>> slots_;  // per group, aligned with its params
};

}  // namespace detail

// torch.optim.Adam: weight decay as an L2 penalty added to the gradient.
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options);
  Adam(std::vector<ParamGroup> groups, AdamOptions options);

  void step() override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  // Adds a group, filling its missing fields from the options given at construction.
  void add_param_group(ParamGroup group);
  const AdamOptions& defaults() const { return defaults_; }
  // The state of the i-th parameter (numbered across groups); step 0 before its first step.
  const detail::AdamState::Slot& state(size_t i) const { return state_.slot(i, "Adam"); }

 private:
  AdamOptions defaults_;
  detail::AdamState state_;
};

// torch.optim.AdamW: decoupled weight decay (p *= 1 - lr * weight_decay before the Adam step).
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options);
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options);

  void step() override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  void add_param_group(ParamGroup group);
  const AdamWOptions& defaults() const { return defaults_; }
  const detail::AdamState::Slot& state(size_t i) const { return state_.slot(i, "AdamW"); }

 private:
  AdamWOptions defaults_;
  detail::AdamState state_;
};

}  // namespace hsgd::optim
