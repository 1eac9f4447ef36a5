#include "framework/train/trainer.h"

#include <utility>

#include "comm/error.h"
#include "framework/tensor/ops.h"

namespace hsgd {
namespace {

// Adapts a callable to the PostStepStage interface.
class FunctionStage : public PostStepStage {
 public:
  explicit FunctionStage(std::function<void(StepContext&)> fn) : fn_(std::move(fn)) {}
  void after_step(StepContext& context) override { fn_(context); }

 private:
  const std::function<void(StepContext&)> fn_;
};

}  // namespace

Trainer::Trainer(ForwardFn forward, std::shared_ptr<Optimizer> optimizer, LossFn loss)
    : forward_(std::move(forward)),
      optimizer_(std::move(optimizer)),
      loss_(loss ? std::move(loss)
                 : LossFn([](const Tensor& outputs, const std::vector<int64_t>& targets) {
                     return cross_entropy(outputs, targets);
                   })) {
  HSGD_CHECK(optimizer_ != nullptr, "Trainer: optimizer is null");
}

Trainer& Trainer::add_stage(std::shared_ptr<PostStepStage> stage) {
  HSGD_CHECK(stage != nullptr, "Trainer::add_stage: stage ", stages_.size(), " is null");
  stages_.push_back(std::move(stage));
  return *this;
}

Trainer& Trainer::add_stage(std::function<void(StepContext&)> stage) {
  HSGD_CHECK(static_cast<bool>(stage), "Trainer::add_stage: stage ", stages_.size(),
             " is an empty function");
  return add_stage(std::make_shared<FunctionStage>(std::move(stage)));
}

float Trainer::step(const Tensor& inputs, const std::vector<int64_t>& targets) {
  HSGD_CHECK(static_cast<bool>(forward_),
             "Trainer::step(inputs, targets) needs a forward function; pass one to the "
             "constructor or use step(forward_loss)");
  return step([&] { return loss_(forward_(inputs), targets); });
}

float Trainer::step(const std::function<Tensor()>& forward_loss) {
  optimizer_->zero_grad();
  Tensor loss = forward_loss();
  HSGD_CHECK_EQ(loss.numel(), 1, "Trainer::step: the loss must be a scalar");
  loss.backward();
  optimizer_->step();
  StepContext context{.iteration = iteration_, .loss = loss.item(), .optimizer = *optimizer_};
  for (const auto& stage : stages_) stage->after_step(context);
  ++iteration_;
  return context.loss;
}

StateDict Trainer::state_dict() const {
  StateDict state;
  state.set("iteration", iteration_);
  return state;
}

void Trainer::load_state_dict(const StateDict& state) {
  const int64_t iteration = state.get_int("iteration");
  HSGD_CHECK_GE(iteration, 0, "Trainer::load_state_dict: iteration");
  iteration_ = iteration;
}

}  // namespace hsgd
