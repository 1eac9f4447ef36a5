#pragma once
// Model averagers: run after optimizer.step() to average the model over a process group
// periodically (post-local SGD, arXiv 1808.07217), like torch's
// torch.distributed.algorithms.model_averaging.averagers.
//
// Contract shared by every averager:
// - average_parameters() is called once per training step on every rank of the group. It
//   averages only when the averager's schedule says so, and advances step() on EVERY call.
// - Parameters whose grad() is undefined are skipped (they did not train this step).
// - One persistent flat buffer per averager and one allreduce per averaging: after the first
//   averaging of a given model, no memory is allocated.
// - Construction is collective over the group: the ranks exchange their configuration (an
//   allgather of a few integers) and throw hsgd::InvalidArgument on every rank when they
//   disagree or when it is invalid, instead of hanging later or averaging the wrong groups.
//   They also compare the shapes of options.average_buffers, and at the first averaging the
//   shapes of everything they average, across the whole group (replica_check.h: one small
//   allgather, once), so that a model that differs between ranks fails with a message naming
//   the first differing tensor instead of aborting inside Gloo or mixing unrelated weights.
// - Beyond torch: options.average_buffers are averaged with the parameters (BatchNorm running
//   statistics); level_stats() counts, per level, the averagings, payload bytes and seconds.
//
// Usage (post-local SGD: DDP with post_localSGD_hook for 100 steps, then average every 4):
//   auto averager = std::make_shared<hsgd::distributed::PeriodicModelAverager>(4, 100, pg);
//   for (...) { opt.zero_grad(); loss.backward(); opt.step();
//               averager->average_parameters(model->parameters()); }
// or plug it into a Trainer as a post-step stage (trainer.add_stage(averager)), or wrap the
// optimizer in optim::PostLocalSGDOptimizer.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "framework/distributed/model_averaging/utils.h"
#include "framework/tensor/tensor.h"
#include "framework/train/optimizer.h"
#include "framework/train/trainer.h"

namespace hsgd::distributed {

struct ModelAveragerOptions {
  // Tensors averaged together with the parameters at every averaging (in the same allreduce),
  // e.g. model->buffers() for BatchNorm running statistics. Same order on every rank.
  std::vector<Tensor> average_buffers;
};

// What one level of averaging has cost so far (PeriodicModelAverager has one level).
struct AveragingLevelStats {
  int64_t period = 0;
  int group_size = 0;
  int64_t calls = 0;     // averagings run at this level
  int64_t bytes = 0;     // allreduce payload (4 bytes per averaged element), summed over calls
  double seconds = 0.0;  // wall time inside averaging (pack, allreduce, unpack)
};

// Base class. Usable as a Trainer post-step stage: after_step() averages the optimizer's
// param groups.
class ModelAverager : public PostStepStage {
 public:
  ModelAverager(const ModelAverager&) = delete;
  ModelAverager& operator=(const ModelAverager&) = delete;
  ~ModelAverager() override = default;

  // Averages params if the schedule says so at the current step; then step() += 1.
  virtual void average_parameters(const std::vector<Tensor>& params) = 0;
  // Same over the parameters of the optimizer's param groups.
  void average_parameters(const std::vector<ParamGroup>& groups);

  // Number of average_parameters calls so far (restored from checkpoints by
  // PostLocalSGDOptimizer::load_state_dict).
  int64_t step() const { return step_; }
  void set_step(int64_t step);

  const std::vector<AveragingLevelStats>& level_stats() const { return stats_; }
  // Whether the last average_parameters call averaged over the whole process group, so that
  // every replica's parameters are equal now (a checkpoint then may resume on another world
  // size; see framework/checkpoint/checkpointer.h).
  bool averaged_whole_group_last_step() const { return whole_group_step_ == step_ - 1; }

  // For checkpoints: "step" (int64) and per level i "levels.<i>.{calls,bytes}" (int64) and
  // "levels.<i>.seconds" (double), so level_stats() keep counting across a resume.
  virtual StateDict state_dict() const;
  // Restores what state_dict() stored; the level entries are optional (a state with only
  // "step", e.g. from PostLocalSGDOptimizer, restores the step). InvalidArgument when the state
  // has more levels than this averager; nothing is changed then.
  virtual void load_state_dict(const StateDict& state);
  const std::shared_ptr<comm::ProcessGroup>& process_group() const { return pg_; }

  // PostStepStage: average_parameters(context.optimizer.param_groups()).
  void after_step(StepContext& context) override;

 protected:
  ModelAverager(std::shared_ptr<comm::ProcessGroup> pg, ModelAveragerOptions options,
                const char* class_name);

  // Averages the params with a gradient, plus the option buffers, over group and charges the
  // cost to level_stats()[level]. A null group (not a member) does nothing.
  void average_at_level(size_t level, const std::vector<Tensor>& params, comm::ProcessGroup* group);
  // Collective over pg_: every rank passed average_buffers of the same shapes. Called by the
  // subclasses' constructors after their configuration check.
  void check_buffers_on_all_ranks();

  // Constant after construction.
  const std::shared_ptr<comm::ProcessGroup> pg_;
  const ModelAveragerOptions options_;
  const char* const class_name_;

  int64_t step_ = 0;
  int64_t whole_group_step_ = -1;  // the last step whose averaging covered the whole group
  std::vector<AveragingLevelStats> stats_;

 private:
  FlatAverager flat_;
  bool tensors_checked_ = false;           // the first averaging compared the tensors across ranks
  std::vector<std::string> level_labels_;  // "averager 2:4" per level, for failure reports
};

// Averages every `period` steps once warmup_steps have passed: at calls where
// step >= warmup_steps and (step - warmup_steps) % period == 0.
//
// Errors (hsgd::InvalidArgument, on every rank): null pg, period < 1, warmup_steps < 0, ranks
// passing different period or warm-up. period == 1 only warns (DDP alone would be cheaper).
class PeriodicModelAverager : public ModelAverager {
 public:
  PeriodicModelAverager(int64_t period, int64_t warmup_steps,
                        std::shared_ptr<comm::ProcessGroup> pg, ModelAveragerOptions options = {});

  using ModelAverager::average_parameters;
  void average_parameters(const std::vector<Tensor>& params) override;

  int64_t period() const { return period_; }
  int64_t warmup_steps() const { return warmup_steps_; }

 private:
  const int64_t period_;
  const int64_t warmup_steps_;
};

}  // namespace hsgd::distributed
