#pragma once
// PostLocalSGDOptimizer: wraps an optimizer and a model averager so that one step() is the
// inner step followed by model averaging, like torch.distributed.optim.PostLocalSGDOptimizer.
//
// step() = inner->step(), then averager->average_parameters(param_groups()). param_groups(),
// zero_grad() are the inner optimizer's. state_dict() is the inner state plus the averager's
// step under "step" (int64), so that a run restored from a checkpoint does not warm up again;
// load_state_dict() restores it, or logs a warning and sets it to 0 when "step" is missing
// (torch warns "Loaded state dict does not contain a step counter for an averager. Setting step
// counter to 0.").
//
// Usage (DDP with post_localSGD_hook until step 100, then local SGD averaged every 4 steps):
//   auto sgd = std::make_shared<hsgd::optim::SGD>(model->parameters(),
//                                                 hsgd::optim::SGDOptions{.lr = 0.1});
//   auto averager = std::make_shared<hsgd::distributed::PeriodicModelAverager>(4, 100, pg);
//   hsgd::optim::PostLocalSGDOptimizer opt(sgd, averager);
//   opt.zero_grad(); loss.backward(); opt.step();

#include <memory>
#include <vector>

#include "framework/distributed/model_averaging/averagers.h"
#include "framework/train/optimizer.h"

namespace hsgd::optim {

class PostLocalSGDOptimizer : public Optimizer {
 public:
  // Both must be non-null (InvalidArgument otherwise).
  PostLocalSGDOptimizer(std::shared_ptr<Optimizer> inner,
                        std::shared_ptr<distributed::ModelAverager> averager);

  void step() override;
  void zero_grad() override;
  std::vector<ParamGroup>& param_groups() override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

  Optimizer& inner() { return *inner_; }
  distributed::ModelAverager& averager() { return *averager_; }

 private:
  // Constant after construction.
  const std::shared_ptr<Optimizer> inner_;
  const std::shared_ptr<distributed::ModelAverager> averager_;
};

}  // namespace hsgd::optim
