#pragma once
// optim::SGD: stochastic gradient descent with momentum, dampening, Nesterov momentum and weight
// decay, exactly as torch.optim.SGD in PyTorch 1.13 (maximize=False). For each parameter p with
// a defined gradient g, per step:
//   g = g + weight_decay * p                              (if weight_decay != 0)
//   if momentum != 0:
//     buf = g                        on the first step    (no dampening on the first step)
//     buf = momentum * buf + (1 - dampening) * g          afterwards
//     g = nesterov ? g + momentum * buf : buf
//   p = p - lr * g
// Parameters whose gradient is undefined are skipped (their momentum buffer is untouched).
//
// Usage:
//   optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4});
//   // or with groups; a field a group leaves empty takes the SGDOptions value:
//   std::vector<Tensor> backbone = model->parameters(), head;
//   optim::SGD grouped({{.params = backbone, .lr = 0.01}, {.params = head}}, {.lr = 0.1});
//
// Errors (InvalidArgument naming the value): lr < 0, momentum < 0, weight_decay < 0, nesterov
// with momentum <= 0 or dampening != 0, an empty parameter list, a parameter in two groups.
//
// state_dict(): the base class's group entries plus "state.<i>.momentum_buffer" (a copy) for
// every parameter i (numbered across groups in order, as torch does) that has a buffer.

#include <vector>

#include "framework/train/optimizer.h"

namespace hsgd::optim {

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  SGD(std::vector<ParamGroup> param_groups, SGDOptions options);

  void step() override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

  // Adds a group, filling its empty fields from the options given at construction.
  void add_param_group(ParamGroup group);

  const SGDOptions& defaults() const { return defaults_; }
  // The momentum buffer of the i-th parameter (numbered across groups); undefined before its
  // first step or without momentum.
  Tensor momentum_buffer(size_t i) const;

 private:
  void check_group(ParamGroup& group, size_t index);

  SGDOptions defaults_;
  // One entry per group, aligned with the group's params: the momentum buffers.
  std::vector<std::vector<Tensor>> buffers_;
};

}  // namespace hsgd::optim
