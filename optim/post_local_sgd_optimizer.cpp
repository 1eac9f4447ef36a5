#include "optim/post_local_sgd_optimizer.h"

#include <utility>

#include "comm/error.h"
#include "comm/log.h"

namespace hsgd::optim {

PostLocalSGDOptimizer::PostLocalSGDOptimizer(std::shared_ptr<Optimizer> inner,
                                             std::shared_ptr<distributed::ModelAverager> averager)
    : inner_(std::move(inner)), averager_(std::move(averager)) {
  HSGD_CHECK(inner_ != nullptr, "PostLocalSGDOptimizer: the inner optimizer is null");
  HSGD_CHECK(averager_ != nullptr, "PostLocalSGDOptimizer: the averager is null");
}

void PostLocalSGDOptimizer::step() {
  inner_->step();
  averager_->average_parameters(inner_->param_groups());
}

void PostLocalSGDOptimizer::zero_grad() { inner_->zero_grad(); }

std::vector<ParamGroup>& PostLocalSGDOptimizer::param_groups() { return inner_->param_groups(); }

StateDict PostLocalSGDOptimizer::state_dict() const {
  StateDict state = inner_->state_dict();
  state.set("step", averager_->step());
  return state;
}

void PostLocalSGDOptimizer::load_state_dict(const StateDict& state) {
  inner_->load_state_dict(state);
  if (state.contains("step")) {
    averager_->set_step(state.get_int("step"));
  } else {
    comm::logger()->warn(
        "PostLocalSGDOptimizer: Loaded state dict does not contain a step counter for an "
        "averager. Setting step counter to 0.");
    averager_->set_step(0);
  }
}

}  // namespace hsgd::optim
