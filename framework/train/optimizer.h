#pragma once
// The optimizer interface a training loop, the Runtime and the model averagers need. It lives in
// framework/ so that framework code never includes optim/ (where SGD etc. are implemented).
//
// An Optimizer owns a list of ParamGroups: parameter handles plus hyper-parameters, as
// torch.optim's param_groups. LR schedulers and averagers reach the parameters and the learning
// rate through param_groups().
//
// Usage:
//   std::shared_ptr<Optimizer> opt = std::make_shared<optim::SGD>(model->parameters(),
//                                                                 optim::SGDOptions{.lr = 0.1});
//   opt->zero_grad();
//   loss.backward();
//   opt->step();
//   StateDict saved = opt->state_dict();     // for a checkpoint
//   opt->load_state_dict(saved);

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "framework/tensor/tensor.h"
#include "framework/train/state_dict.h"

namespace hsgd {

// Parameters and their hyper-parameters. A field left empty (std::nullopt) when a group is passed
// to an optimizer's constructor takes that optimizer's default (as a key missing from a torch
// param-group dict does); once the optimizer is constructed every field its algorithm uses is
// set, so readers may use *group.lr. `options` holds hyper-parameters of other algorithms.
struct ParamGroup {
  std::vector<Tensor> params = {};
  std::optional<double> lr = std::nullopt;
  std::optional<double> momentum = std::nullopt;
  std::optional<double> dampening = std::nullopt;
  std::optional<double> weight_decay = std::nullopt;
  std::optional<bool> nesterov = std::nullopt;
  std::map<std::string, double> options = {};
};

// The interface. The base class stores the param groups; implementations fill in missing
// hyper-parameters in their constructor and implement step(). A wrapper (e.g.
// PostLocalSGDOptimizer) may override param_groups() to expose its inner optimizer's groups.
class Optimizer {
 public:
  explicit Optimizer(std::vector<ParamGroup> param_groups = {});
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter with a defined gradient (no autograd history is recorded).
  virtual void step() = 0;
  // Zeroes every defined gradient of every group (PyTorch 1.13's default, set_to_none=False).
  virtual void zero_grad();
  virtual std::vector<ParamGroup>& param_groups() { return param_groups_; }
  const std::vector<ParamGroup>& param_groups() const {
    return const_cast<Optimizer*>(this)->param_groups();
  }
  // The base stores, per group g, "param_groups.<g>.{lr,momentum,dampening,weight_decay}"
  // (double, when set), "param_groups.<g>.nesterov" (int64 0/1, when set),
  // "param_groups.<g>.options.<name>" (double) and "param_groups.<g>.num_params" (int64).
  virtual StateDict state_dict() const;
  // Restores what state_dict() stored. Throws InvalidArgument when the number of groups or of
  // parameters per group differs from this optimizer's; nothing is modified then.
  virtual void load_state_dict(const StateDict& state);

 private:
  std::vector<ParamGroup> param_groups_;
};

}  // namespace hsgd
