#pragma once
// Learning-rate schedulers, as torch.optim.lr_scheduler in PyTorch 1.13. A scheduler remembers
// each group's learning rate at construction (base_lr) and, at epoch e (the number of step()
// calls so far), sets every group's lr to the closed form f(e, base_lr):
//   StepLR             base_lr * gamma^floor(e / step_size)
//   MultiStepLR        base_lr * gamma^(number of milestones <= e)
//   CosineAnnealingLR  eta_min + (base_lr - eta_min) * (1 + cos(pi * e / t_max)) / 2
//   LinearWarmup       base_lr * (start + (end - start) * min(e, total_iters) / total_iters)
//                      (torch's LinearLR)
//   SequentialLR       schedulers[i].lr_at(e - milestones[i-1], base_lr) for the i with
//                      milestones[i-1] <= e < milestones[i] (e.g. warm-up, then cosine)
// Construction already applies epoch 0 (as torch does, so LinearWarmup starts at
// start_factor * lr). base_lr is the group's "initial_lr" option when it has one, else its lr,
// and construction stores it as "initial_lr" (torch's group.setdefault('initial_lr', lr)): a
// scheduler built after optimizer.load_state_dict() keeps the schedule's original base instead
// of taking the restored, already decayed lr as its base. Call step() after optimizer.step(), once
// per epoch (or per iteration if the schedule is counted in iterations).
//
// Torch computes the same values recursively from the current lr; the closed form here gives the
// same numbers when one scheduler owns the lr, but overwrites changes made to lr by others.
//
// Usage:
//   optim::SGD opt(params, {.lr = 0.1, .momentum = 0.9});
//   optim::StepLR sched(opt, {.step_size = 30, .gamma = 0.1});
//   for (int epoch = 0; epoch < 90; ++epoch) {
//     // ... train one epoch with opt ...
//     sched.step();
//   }
//
// The optimizer must outlive the scheduler. Bad options throw InvalidArgument naming the value.

#include <cstdint>
#include <memory>
#include <vector>

#include "framework/runtime/training_state.h"
#include "framework/train/optimizer.h"

namespace hsgd::optim {

class LRScheduler : public runtime::Scheduler {
 public:
  ~LRScheduler() override = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances one epoch and updates every group's lr.
  void step() override;
  // Jumps to epoch (e.g. when resuming from a checkpoint) and updates every group's lr.
  void set_last_epoch(int64_t epoch);
  int64_t last_epoch() const { return last_epoch_; }
  // The lr of each group as last set by this scheduler.
  std::vector<double> get_last_lr() const { return last_lr_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  const Optimizer& optimizer() const { return optimizer_; }
  // The schedule's closed form.
  virtual double lr_at(int64_t epoch, double base_lr) const = 0;

  // For checkpoints: "last_epoch" (int64) and "base_lrs.<g>" (double) per param group.
  StateDict state_dict() const override;
  // Restores both and sets every group's lr for the restored epoch. Throws InvalidArgument
  // (nothing changed) when the number of base lrs differs from the optimizer's param groups.
  void load_state_dict(const StateDict& state) override;

 protected:
  // base_lrs: each group's lr now (the usual case), or given (SequentialLR passes its first
  // scheduler's, as torch uses every group's "initial_lr").
  explicit LRScheduler(Optimizer& optimizer);
  LRScheduler(Optimizer& optimizer, std::vector<double> base_lrs);
  // Sets epoch 0; derived constructors call it after validating their options.
  void initialize() { set_last_epoch(0); }

 private:
  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  int64_t last_epoch_ = 0;
};

struct StepLROptions {
  int64_t step_size = 1;
  double gamma = 0.1;
};
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, StepLROptions options);
  double lr_at(int64_t epoch, double base_lr) const override;

 private:
  StepLROptions options_;
};

struct MultiStepLROptions {
  std::vector<int64_t> milestones;  // any order; repeats multiply gamma again, as in torch
  double gamma = 0.1;
};
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, MultiStepLROptions options);
  double lr_at(int64_t epoch, double base_lr) const override;

 private:
  MultiStepLROptions options_;
};

struct CosineAnnealingLROptions {
  int64_t t_max = 1;
  double eta_min = 0;
};
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, CosineAnnealingLROptions options);
  double lr_at(int64_t epoch, double base_lr) const override;

 private:
  CosineAnnealingLROptions options_;
};

struct LinearWarmupOptions {
  double start_factor = 1.0 / 3;
  double end_factor = 1.0;
  int64_t total_iters = 5;
};
class LinearWarmup : public LRScheduler {
 public:
  LinearWarmup(Optimizer& optimizer, LinearWarmupOptions options);
  double lr_at(int64_t epoch, double base_lr) const override;

 private:
  LinearWarmupOptions options_;
};

// Runs schedulers one after the other (torch's SequentialLR): schedulers[0] from epoch 0,
// schedulers[i] from epoch milestones[i-1], each counting its epochs from 0 when it starts.
// All use the base lrs of schedulers[0] (the lrs before any scheduler touched them; construct
// the schedulers in order), whatever a later scheduler captured at its construction; the
// sub-schedulers only provide their closed forms and are not stepped themselves. Throws
// hsgd::InvalidArgument unless there is one milestone fewer than schedulers, the milestones
// are positive and strictly increasing, and every scheduler drives this optimizer.
//   optim::LinearWarmup warmup(opt, {.start_factor = 0.1, .total_iters = 5});
//   optim::CosineAnnealingLR cosine(opt, {.t_max = 95});
//   optim::SequentialLR sched(opt, {&warmup, &cosine}, {5});
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<const LRScheduler*> schedulers,
               std::vector<int64_t> milestones);
  double lr_at(int64_t epoch, double base_lr) const override;

 private:
  std::vector<const LRScheduler*> schedulers_;
  std::vector<int64_t> milestones_;
};

}  // namespace hsgd::optim
