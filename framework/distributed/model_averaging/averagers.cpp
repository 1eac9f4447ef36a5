#include "framework/distributed/model_averaging/averagers.h"

#include <chrono>
#include <utility>

#include "comm/error.h"
#include "comm/log.h"
#include "framework/distributed/model_averaging/config_check.h"
#include "framework/distributed/replica_check.h"

namespace hsgd::distributed {

// ---- ModelAverager ----

ModelAverager::ModelAverager(std::shared_ptr<comm::ProcessGroup> pg, ModelAveragerOptions options,
                             const char* class_name)
    : pg_(std::move(pg)), options_(std::move(options)), class_name_(class_name) {
  HSGD_CHECK(pg_ != nullptr, class_name_,
             ": process group is null; pass the group to average over (there is no default "
             "group in hsgd)");
}

void ModelAverager::average_parameters(const std::vector<ParamGroup>& groups) {
  average_parameters(get_params_to_average(groups));
}

void ModelAverager::set_step(int64_t step) {
  HSGD_CHECK_GE(step, 0, class_name_, ": step must be >= 0");
  step_ = step;
}

StateDict ModelAverager::state_dict() const {
  StateDict state;
  state.set("step", step_);
  for (size_t i = 0; i < stats_.size(); ++i) {
    const std::string level = "levels." + std::to_string(i) + ".";
    state.set(level + "calls", stats_[i].calls);
    state.set(level + "bytes", stats_[i].bytes);
    state.set(level + "seconds", stats_[i].seconds);
  }
  return state;
}

void ModelAverager::load_state_dict(const StateDict& state) {
  const int64_t step = state.get_int("step");
  HSGD_CHECK_GE(step, 0, class_name_, "::load_state_dict: step");
  const std::string extra = "levels." + std::to_string(stats_.size()) + ".calls";
  HSGD_CHECK(!state.contains(extra), class_name_, "::load_state_dict: the state has more than ",
             stats_.size(), " levels ('", extra, "' exists)");
  for (size_t i = 0; i < stats_.size(); ++i) {
    const std::string level = "levels." + std::to_string(i) + ".";
    if (!state.contains(level + "calls")) continue;
    stats_[i].calls = state.get_int(level + "calls");
    stats_[i].bytes = state.get_int(level + "bytes");
    stats_[i].seconds = state.get_double(level + "seconds");
  }
  step_ = step;
  // The step before the restored one was a checkpoint's step: whether it averaged over the
  // whole group is not recorded, so do not claim it.
  whole_group_step_ = -1;
}

void ModelAverager::after_step(StepContext& context) {
  average_parameters(context.optimizer.param_groups());
}

void ModelAverager::average_at_level(size_t level, const std::vector<Tensor>& params,
                                     comm::ProcessGroup* group) {
  const std::vector<Tensor> to_average = get_params_to_average(params);
  if (!tensors_checked_) {
    // Once, over the whole group: every rank averages at the same step (same schedule).
    std::vector<detail::TensorEntry> entries = detail::describe_tensors(to_average, "parameter");
    const auto buffers = detail::describe_tensors(options_.average_buffers, "buffer");
    entries.insert(entries.end(), buffers.begin(), buffers.end());
    detail::check_same_tensors(*pg_, class_name_, entries,
                               "what to average (parameters with a gradient, then buffers)");
    tensors_checked_ = true;
  }
  if (group == nullptr) return;
  if (level_labels_.size() <= level) level_labels_.resize(stats_.size());
  if (level_labels_[level].empty()) {
    level_labels_[level] = hsgd::detail::str_cat("averager ", stats_.at(level).period, ":",
                                                 stats_.at(level).group_size);
  }
  const auto start = std::chrono::steady_clock::now();
  const int64_t bytes =
      flat_.average(to_average, options_.average_buffers, *group, level_labels_[level]);
  const std::chrono::duration<double> spent = std::chrono::steady_clock::now() - start;
  if (group->size() == pg_->size()) whole_group_step_ = step_;
  AveragingLevelStats& s = stats_.at(level);
  s.calls += 1;
  s.bytes += bytes;
  s.seconds += spent.count();
}

void ModelAverager::check_buffers_on_all_ranks() {
  detail::check_same_tensors(*pg_, class_name_,
                             detail::describe_tensors(options_.average_buffers, "buffer"),
                             "options.average_buffers");
}

// ---- PeriodicModelAverager ----

PeriodicModelAverager::PeriodicModelAverager(int64_t period, int64_t warmup_steps,
                                             std::shared_ptr<comm::ProcessGroup> pg,
                                             ModelAveragerOptions options)
    : ModelAverager(std::move(pg), std::move(options), "PeriodicModelAverager"),
      period_(period),
      warmup_steps_(warmup_steps) {
  std::string error;
  if (period_ < 1) {
    error = hsgd::detail::str_cat("PeriodicModelAverager: period must be >= 1, got ", period_);
  } else if (warmup_steps_ < 0) {
    error = hsgd::detail::str_cat("PeriodicModelAverager: warmup_steps must be >= 0, got ",
                                  warmup_steps_);
  }
  detail::check_config_on_all_ranks(*pg_, class_name_, {{period_, pg_->size()}}, warmup_steps_,
                                    error);
  check_buffers_on_all_ranks();
  if (period_ == 1) {
    comm::logger()->warn(
        "PeriodicModelAverager (rank {} of group '{}'): period 1 averages the model at every "
        "step, which costs no less than DDP's gradient allreduce; use DDP alone instead",
        pg_->rank(), pg_->name());
  }
  stats_.push_back(AveragingLevelStats{.period = period_, .group_size = pg_->size()});
}

void PeriodicModelAverager::average_parameters(const std::vector<Tensor>& params) {
  if (step_ >= warmup_steps_ && (step_ - warmup_steps_) % period_ == 0) {
    average_at_level(0, params, pg_.get());
  }
  step_ += 1;
}

}  // namespace hsgd::distributed
