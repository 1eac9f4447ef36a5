#include "framework/distributed/model_averaging/averagers.h"

#include <chrono>
#include <utility>

#include "comm/error.h"
#include "comm/log.h"
#include "framework/distributed/flat_buffer.h"
#include "framework/distributed/model_averaging/averaging_level.h"
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

ModelAverager::~ModelAverager() = default;

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
    state.set(level + "overlap_wait_seconds", stats_[i].overlap_wait_seconds);
    if (i < levels_.size()) levels_[i]->save(state, level);
  }
  return state;
}

StateDict ModelAverager::settled_level_state(size_t level) const {
  HSGD_CHECK(level < levels_.size(), class_name_, "::settled_level_state: level ", level,
             " does not exist; the averager has ", levels_.size());
  StateDict state;
  levels_[level]->save_settled(state, "levels." + std::to_string(level) + ".");
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
    levels_.at(i)->load(state, level);
    if (!state.contains(level + "calls")) continue;
    stats_[i].calls = state.get_int(level + "calls");
    stats_[i].bytes = state.get_int(level + "bytes");
    stats_[i].seconds = state.get_double(level + "seconds");
    if (state.contains(level + "overlap_wait_seconds")) {
      stats_[i].overlap_wait_seconds = state.get_double(level + "overlap_wait_seconds");
    }
  }
  step_ = step;
  // The step before the restored one was a checkpoint's step: whether it averaged over the
  // whole group is not recorded, so do not claim it.
  whole_group_step_ = -1;
  whole_group_start_step_ = -1;
}

void ModelAverager::average_at_level(size_t level, const std::vector<Tensor>& params,
                                     comm::ProcessGroup* group) {
  const std::vector<Tensor> to_average = get_params_to_average(params);
  if (group == nullptr) return;
  if (level_labels_.size() <= level) level_labels_.resize(stats_.size());
  if (level_labels_[level].empty()) {
    level_labels_[level] =
        hsgd::str_cat("averager ", stats_.at(level).period, ":", stats_.at(level).group_size);
  }
  const auto start = std::chrono::steady_clock::now();
  const int64_t bytes =
      flat_.average(to_average, options_.average_buffers, *group, level_labels_[level]);
  const std::chrono::duration<double> spent = std::chrono::steady_clock::now() - start;
  if (group->size() == pg_->size()) whole_group_step_ = whole_group_start_step_ = step_;
  AveragingLevelStats& s = stats_.at(level);
  s.calls += 1;
  s.bytes += bytes;
  s.seconds += spent.count();
}

void ModelAverager::add_level(const LevelOptions& options,
                              std::shared_ptr<comm::ProcessGroup> group) {
  if (options.overlap_steps > options.period && pg_->rank() == 0) {
    // The schedule (averagers.h) merges a pending averaging before the level's next one.
    comm::logger()->warn(
        "{} level {} ({}): overlap_steps {} exceeds the period {}, but an averaging is merged "
        "before the level's next one starts, so it overlaps at most {} steps (give overlap_steps "
        "<= {})",
        class_name_, levels_.size(), describe(options), options.overlap_steps, options.period,
        options.period, options.period);
  }
  levels_.push_back(std::make_unique<detail::AveragingLevel>(levels_.size(), options, group));
  level_options_.push_back(options);
  // A node level's groups differ in size (3 + 1 ranks): count this rank's.
  const int group_size =
      options.group_size == kNodeGroup && group != nullptr ? group->size() : options.group_size;
  stats_.push_back(AveragingLevelStats{.period = options.period, .group_size = group_size});
}

bool ModelAverager::has_pending() const {
  for (const auto& level : levels_) {
    if (level->pending()) return true;
  }
  return false;
}

std::vector<Tensor> ModelAverager::pack(const std::vector<Tensor>& params, int64_t& n_params) {
  std::vector<Tensor> tensors = get_params_to_average(params);
  n_params = flat_numel(tensors);
  tensors.insert(tensors.end(), options_.average_buffers.begin(), options_.average_buffers.end());
  x_.resize(static_cast<size_t>(flat_numel(tensors)));
  flatten_into(tensors, x_);
  return tensors;
}

void ModelAverager::complete_level(size_t level) {
  for (size_t below = 0; below < level; ++below) {
    if (levels_[below]->pending()) complete_level(below);
  }
  const auto start = std::chrono::steady_clock::now();
  detail::AveragingLevel& current = *levels_[level];
  const bool overlapped = current.options().overlap_steps > 0;
  const double waited = current.receive();
  if (overlapped) stats_[level].overlap_wait_seconds += waited;
  const std::span<const float> result = current.complete(x_);
  for (size_t below = 0; below < level; ++below) levels_[below]->reset_anchor(result);
  if (!overlapped && current.group()->size() == pg_->size()) whole_group_step_ = step_;
  const std::chrono::duration<double> spent = std::chrono::steady_clock::now() - start;
  stats_[level].seconds += spent.count();
}

void ModelAverager::check_tensors_once(const std::vector<Tensor>& params) {
  if (tensors_checked_) return;
  const std::vector<Tensor> to_average = get_params_to_average(params);
  std::vector<detail::TensorEntry> entries = detail::describe_tensors(to_average, "parameter");
  const auto buffers = detail::describe_tensors(options_.average_buffers, "buffer");
  entries.insert(entries.end(), buffers.begin(), buffers.end());
  detail::check_same_tensors(*pg_, class_name_, entries,
                             "what to average (parameters with a gradient, then buffers)");
  tensors_checked_ = true;
}

void ModelAverager::average_step(int level, const std::vector<Tensor>& params) {
  check_tensors_once(params);
  bool due = false, settle = false, anchored_below = false;
  for (size_t l = 0; l < levels_.size(); ++l) {
    const bool at_or_below = level >= 0 && l <= static_cast<size_t>(level);
    due |= levels_[l]->pending() && levels_[l]->due_step() <= step_;
    settle |= at_or_below && levels_[l]->pending();
    anchored_below |= at_or_below && static_cast<int>(l) < level && is_anchored(level_options_[l]);
  }
  const bool plain = level >= 0 && levels_[level]->plain();
  if (!due && !settle && !anchored_below && (level < 0 || plain)) {
    // Plain averaging, exactly as torch's (and hsgd's before level options).
    if (level >= 0) average_at_level(static_cast<size_t>(level), params, levels_[level]->group());
    return;
  }
  int64_t n_params = 0;
  const std::vector<Tensor> tensors = pack(params, n_params);
  for (size_t l = 0; l < levels_.size(); ++l) {
    if (levels_[l]->pending() && levels_[l]->due_step() <= step_) complete_level(l);
  }
  if (level >= 0) {
    const auto top = static_cast<size_t>(level);
    for (size_t l = 0; l <= top; ++l) {
      if (levels_[l]->pending()) complete_level(l);
    }
    detail::AveragingLevel& current = *levels_[top];
    if (plain) {
      unflatten_from(x_, tensors);
      average_at_level(top, params, current.group());
      flatten_into(tensors, x_);
      for (size_t below = 0; below < top; ++below) levels_[below]->reset_anchor(x_);
    } else if (current.group() != nullptr) {
      const auto start = std::chrono::steady_clock::now();
      stats_[top].calls += 1;
      stats_[top].bytes += current.start(step_, x_, n_params);
      if (current.group()->size() == pg_->size()) whole_group_start_step_ = step_;
      const std::chrono::duration<double> spent = std::chrono::steady_clock::now() - start;
      stats_[top].seconds += spent.count();
      if (current.options().overlap_steps == 0) complete_level(top);
    }
  }
  unflatten_from(x_, tensors);
}

void ModelAverager::finish_pending(const std::vector<Tensor>& params) {
  if (!has_pending()) return;
  int64_t n_params = 0;
  const std::vector<Tensor> tensors = pack(params, n_params);
  for (size_t l = 0; l < levels_.size(); ++l) {
    if (levels_[l]->pending()) complete_level(l);
  }
  unflatten_from(x_, tensors);
}

void ModelAverager::finish_pending(const std::vector<ParamGroup>& groups) {
  finish_pending(get_params_to_average(groups));
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
    : PeriodicModelAverager(LevelOptions{.period = period}, warmup_steps, std::move(pg),
                            std::move(options)) {}

PeriodicModelAverager::PeriodicModelAverager(LevelOptions level, int64_t warmup_steps,
                                             std::shared_ptr<comm::ProcessGroup> pg,
                                             ModelAveragerOptions options)
    : ModelAverager(std::move(pg), std::move(options), "PeriodicModelAverager"),
      period_(level.period),
      warmup_steps_(warmup_steps) {
  using hsgd::str_cat;
  const int requested_size = level.group_size;
  if (level.group_size == 0) level.group_size = pg_->size();
  std::string error;
  if (period_ < 1) {
    error = str_cat("PeriodicModelAverager: period must be >= 1, got ", period_);
  } else if (warmup_steps_ < 0) {
    error = str_cat("PeriodicModelAverager: warmup_steps must be >= 0, got ", warmup_steps_);
  } else if (requested_size != 0 && requested_size != pg_->size()) {
    error = str_cat("PeriodicModelAverager: group_size must be 0 or the process group size ",
                    pg_->size(), ", got ", requested_size);
  } else {
    error = validate_options(level, 0, class_name_);
  }
  detail::check_config_on_all_ranks(*pg_, class_name_, {level}, warmup_steps_, error);
  check_buffers_on_all_ranks();
  if (period_ == 1) {
    comm::logger()->warn(
        "PeriodicModelAverager (rank {} of group '{}'): period 1 averages the model at every "
        "step, which costs no less than DDP's gradient allreduce; use DDP alone instead",
        pg_->rank(), pg_->name());
  }
  add_level(level, pg_);
}

void PeriodicModelAverager::average_parameters(const std::vector<Tensor>& params) {
  const bool averages = step_ >= warmup_steps_ && (step_ - warmup_steps_) % period_ == 0;
  average_step(averages ? 0 : -1, params);
  step_ += 1;
}

}  // namespace hsgd::distributed
