#pragma once
// Trainer: the training step as a small loop with pluggable post-step stages.
//
// One step() = optimizer.zero_grad(), forward + loss, loss.backward(), optimizer.step(), then
// every post-step stage in the order added. A model averager (distributed::ModelAverager) is
// such a stage: it averages the optimizer's param groups after the step, which is the same as
// wrapping the optimizer in optim::PostLocalSGDOptimizer. The post-local SGD gradient hook is
// the other half and plugs into DistributedDataParallel, not here.
//
// Usage:
//   hsgd::Trainer trainer([&](const hsgd::Tensor& x) { return ddp.forward(x); }, optimizer);
//   trainer.add_stage(std::make_shared<hsgd::distributed::PeriodicModelAverager>(4, 100, pg));
//   for (auto& batch : loader) float loss = trainer.step(batch.inputs, batch.targets);
//
// Not thread-safe; one Trainer per rank.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "framework/tensor/tensor.h"
#include "framework/train/optimizer.h"

namespace hsgd {

// What a post-step stage sees after the optimizer stepped.
struct StepContext {
  int64_t iteration;     // 0-based index of the step that just finished
  float loss;            // loss of that step (this rank's)
  Optimizer& optimizer;  // the trainer's optimizer (its param_groups() hold the parameters)
};

// Runs after every optimizer step of a Trainer, in the order stages were added.
class PostStepStage {
 public:
  virtual ~PostStepStage() = default;
  // May throw; the exception propagates out of Trainer::step (the step is then not counted).
  virtual void after_step(StepContext& context) = 0;
};

class Trainer {
 public:
  // outputs = forward(inputs)
  using ForwardFn = std::function<Tensor(const Tensor& inputs)>;
  // A scalar loss from outputs and class targets; cross_entropy by default.
  using LossFn = std::function<Tensor(const Tensor& outputs, const std::vector<int64_t>& targets)>;

  // forward and optimizer must be set; loss defaults to cross_entropy.
  Trainer(ForwardFn forward, std::shared_ptr<Optimizer> optimizer, LossFn loss = {});

  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Appends a stage; stages run in the order added. Returns *this for chaining.
  Trainer& add_stage(std::shared_ptr<PostStepStage> stage);
  // A stage from a callable, e.g. a learning-rate scheduler's step.
  Trainer& add_stage(std::function<void(StepContext&)> stage);

  // One training step on a batch; returns the loss.
  float step(const Tensor& inputs, const std::vector<int64_t>& targets);
  // One training step whose forward and loss are computed by forward_loss (for losses other
  // than classification, e.g. MSE against tensor targets); returns the loss.
  float step(const std::function<Tensor()>& forward_loss);

  int64_t iteration() const { return iteration_; }
  // For checkpoints: "iteration" (int64). The stages keep their own state.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);
  Optimizer& optimizer() { return *optimizer_; }

 private:
  // Constant after construction.
  const ForwardFn forward_;
  const std::shared_ptr<Optimizer> optimizer_;
  const LossFn loss_;

  std::vector<std::shared_ptr<PostStepStage>> stages_;
  int64_t iteration_ = 0;
};

}  // namespace hsgd
