#include "optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "comm/error.h"

namespace hsgd::optim {

namespace {
constexpr const char* kInitialLr = "initial_lr";
}

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {
  std::vector<ParamGroup>& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    HSGD_CHECK(groups[g].lr.has_value(), "LRScheduler: param group ", g, " has no lr");
    const auto initial = groups[g].options.try_emplace(kInitialLr, *groups[g].lr).first;
    base_lrs_.push_back(initial->second);
  }
}

StateDict LRScheduler::state_dict() const {
  StateDict state;
  state.set("last_epoch", last_epoch_);
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    state.set("base_lrs." + std::to_string(g), base_lrs_[g]);
  }
  return state;
}

void LRScheduler::load_state_dict(const StateDict& state) {
  const int64_t epoch = state.get_int("last_epoch");
  HSGD_CHECK_GE(epoch, 0, "LRScheduler::load_state_dict: last_epoch");
  std::vector<double> base_lrs;
  while (state.contains("base_lrs." + std::to_string(base_lrs.size()))) {
    base_lrs.push_back(state.get_double("base_lrs." + std::to_string(base_lrs.size())));
  }
  HSGD_CHECK_EQ(base_lrs.size(), optimizer_.param_groups().size(),
                "LRScheduler::load_state_dict: base lrs in the state vs param groups of the "
                "optimizer");
  base_lrs_ = std::move(base_lrs);
  set_last_epoch(epoch);
}

LRScheduler::LRScheduler(Optimizer& optimizer, std::vector<double> base_lrs)
    : optimizer_(optimizer), base_lrs_(std::move(base_lrs)) {
  HSGD_CHECK_EQ(base_lrs_.size(), optimizer_.param_groups().size(),
                "LRScheduler: one base lr per param group");
}

void LRScheduler::step() { set_last_epoch(last_epoch_ + 1); }

void LRScheduler::set_last_epoch(int64_t epoch) {
  HSGD_CHECK_GE(epoch, 0, "LRScheduler: epoch must be non-negative");
  std::vector<ParamGroup>& groups = optimizer_.param_groups();
  HSGD_CHECK_EQ(groups.size(), base_lrs_.size(),
                "LRScheduler: the optimizer's number of param groups changed");
  last_epoch_ = epoch;
  last_lr_.clear();
  for (size_t g = 0; g < groups.size(); ++g) {
    groups[g].lr = lr_at(epoch, base_lrs_[g]);
    last_lr_.push_back(*groups[g].lr);
  }
}

StepLR::StepLR(Optimizer& optimizer, StepLROptions options)
    : LRScheduler(optimizer), options_(options) {
  HSGD_CHECK(options.step_size > 0, "StepLR: step_size ", options.step_size, " must be positive");
  initialize();
}

double StepLR::lr_at(int64_t epoch, double base_lr) const {
  return base_lr * std::pow(options_.gamma, static_cast<double>(epoch / options_.step_size));
}

MultiStepLR::MultiStepLR(Optimizer& optimizer, MultiStepLROptions options)
    : LRScheduler(optimizer), options_(std::move(options)) {
  for (int64_t m : options_.milestones) {
    HSGD_CHECK(m >= 0, "MultiStepLR: milestone ", m, " must be non-negative");
  }
  initialize();
}

double MultiStepLR::lr_at(int64_t epoch, double base_lr) const {
  const auto passed = std::count_if(options_.milestones.begin(), options_.milestones.end(),
                                    [epoch](int64_t m) { return m <= epoch; });
  return base_lr * std::pow(options_.gamma, static_cast<double>(passed));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, CosineAnnealingLROptions options)
    : LRScheduler(optimizer), options_(options) {
  HSGD_CHECK(options.t_max > 0, "CosineAnnealingLR: t_max ", options.t_max, " must be positive");
  initialize();
}

double CosineAnnealingLR::lr_at(int64_t epoch, double base_lr) const {
  const double phase =
      std::numbers::pi * static_cast<double>(epoch) / static_cast<double>(options_.t_max);
  return options_.eta_min + (base_lr - options_.eta_min) * (1 + std::cos(phase)) / 2;
}

LinearWarmup::LinearWarmup(Optimizer& optimizer, LinearWarmupOptions options)
    : LRScheduler(optimizer), options_(options) {
  HSGD_CHECK(options.start_factor > 0 && options.start_factor <= 1, "LinearWarmup: start_factor ",
             options.start_factor, " must be in (0, 1]");
  HSGD_CHECK(options.end_factor >= 0 && options.end_factor <= 1, "LinearWarmup: end_factor ",
             options.end_factor, " must be in [0, 1]");
  HSGD_CHECK(options.total_iters > 0, "LinearWarmup: total_iters ", options.total_iters,
             " must be positive");
  initialize();
}

double LinearWarmup::lr_at(int64_t epoch, double base_lr) const {
  const double progress = static_cast<double>(std::min(epoch, options_.total_iters)) /
                          static_cast<double>(options_.total_iters);
  return base_lr *
         (options_.start_factor + (options_.end_factor - options_.start_factor) * progress);
}

namespace {
std::vector<double> first_base_lrs(const std::vector<const LRScheduler*>& schedulers) {
  HSGD_CHECK(!schedulers.empty() && schedulers.front() != nullptr,
             "SequentialLR: needs at least one scheduler");
  return schedulers.front()->base_lrs();
}
}  // namespace

SequentialLR::SequentialLR(Optimizer& optimizer, std::vector<const LRScheduler*> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer, first_base_lrs(schedulers)),
      schedulers_(std::move(schedulers)),
      milestones_(std::move(milestones)) {
  HSGD_CHECK(milestones_.size() + 1 == schedulers_.size(), "SequentialLR: ", schedulers_.size(),
             " schedulers need ", schedulers_.size() - 1, " milestones, got ", milestones_.size());
  for (size_t i = 0; i < schedulers_.size(); ++i) {
    HSGD_CHECK(schedulers_[i] != nullptr, "SequentialLR: scheduler ", i, " is null");
    HSGD_CHECK(&schedulers_[i]->optimizer() == &optimizer, "SequentialLR: scheduler ", i,
               " drives another optimizer");
  }
  for (size_t i = 0; i < milestones_.size(); ++i) {
    HSGD_CHECK(milestones_[i] > (i == 0 ? 0 : milestones_[i - 1]), "SequentialLR: milestone ", i,
               " (", milestones_[i], ") must be greater than ",
               i == 0 ? std::string("0")
                      : "milestone " + std::to_string(i - 1) + " (" +
                            std::to_string(milestones_[i - 1]) + ")");
  }
  initialize();
}

double SequentialLR::lr_at(int64_t epoch, double base_lr) const {
  const size_t index = static_cast<size_t>(
      std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin());
  const int64_t start = index == 0 ? 0 : milestones_[index - 1];
  return schedulers_[index]->lr_at(epoch - start, base_lr);
}

}  // namespace hsgd::optim
