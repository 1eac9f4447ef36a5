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
    state.set(level + "peak_bytes_per_second", stats_[i].peak_bytes_per_second);
    for (size_t f = 0; f < levels_.at(i).size(); ++f) levels_[i][f]->save(state, unit_prefix(i, f));
  }
  return state;
}

StateDict ModelAverager::settled_level_state(size_t level) const {
  HSGD_CHECK(level < levels_.size(), class_name_, "::settled_level_state: level ", level,
             " does not exist; the averager has ", levels_.size());
  StateDict state;
  for (size_t f = 0; f < levels_[level].size(); ++f) {
    levels_[level][f]->save_settled(state, unit_prefix(level, f));
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
    for (size_t f = 0; f < levels_.at(i).size(); ++f) levels_[i][f]->load(state, unit_prefix(i, f));
    if (!state.contains(level + "calls")) continue;
    stats_[i].calls = state.get_int(level + "calls");
    stats_[i].bytes = state.get_int(level + "bytes");
    stats_[i].seconds = state.get_double(level + "seconds");
    if (state.contains(level + "overlap_wait_seconds")) {
      stats_[i].overlap_wait_seconds = state.get_double(level + "overlap_wait_seconds");
    }
    if (state.contains(level + "peak_bytes_per_second")) {
      peaks_[i].keep_at_least(state.get_double(level + "peak_bytes_per_second"));
      stats_[i].peak_bytes_per_second = peaks_[i].bytes_per_second();
    }
  }
  step_ = step;
  // The step before the restored one was a checkpoint's step: whether it averaged over the
  // whole group is not recorded, so do not claim it.
  whole_group_step_ = -1;
  whole_group_start_step_ = -1;
  streaming_period_start_step_ = -1;
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
  const auto end = std::chrono::steady_clock::now();
  const std::chrono::duration<double> spent = end - start;
  if (group->size() == pg_->size()) whole_group_step_ = whole_group_start_step_ = step_;
  AveragingLevelStats& s = stats_.at(level);
  s.calls += 1;
  s.bytes += bytes;
  s.seconds += spent.count();
  const auto seconds = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(t.time_since_epoch()).count();
  };
  peaks_.at(level).add(seconds(start), seconds(end), bytes);
  s.peak_bytes_per_second = peaks_[level].bytes_per_second();
}

void ModelAverager::add_level(const LevelOptions& options,
                              std::shared_ptr<comm::ProcessGroup> group) {
  if (merge_delay(options) > options.period && pg_->rank() == 0) {
    // The schedule (averagers.h) merges a pending averaging before the level's next one.
    comm::logger()->warn(
        "{} level {} ({}): overlap_steps {} exceeds the period {}, but an averaging is merged "
        "before the level's next one starts, so it overlaps at most {} steps (give overlap_steps "
        "<= {})",
        class_name_, levels_.size(), describe(options), options.overlap_steps, options.period,
        options.period, options.period);
  }
  // One unit per fragment; each compressed one makes its own node and leader groups (a
  // collective over group), so that fragments in flight together never share a ring.
  std::vector<Unit> units;
  for (int64_t f = 0; f < options.fragments; ++f) {
    units.push_back(std::make_unique<detail::AveragingLevel>(levels_.size(), options, group,
                                                             options.fragments == 1 ? -1 : f));
  }
  levels_.push_back(std::move(units));
  level_options_.push_back(options);
  fragments_.emplace_back();
  peaks_.emplace_back(0.1);
  // A node level's groups differ in size (3 + 1 ranks): count this rank's.
  const int group_size =
      options.group_size == kNodeGroup && group != nullptr ? group->size() : options.group_size;
  stats_.push_back(AveragingLevelStats{.period = options.period, .group_size = group_size});
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

bool PeriodicModelAverager::fragment_starts(size_t, int64_t offset, int64_t step) const {
  const int64_t since = step - warmup_steps_;
  return since >= offset && (since - offset) % period_ == 0;
}

void PeriodicModelAverager::average_parameters(const std::vector<Tensor>& params) {
  const bool averages = step_ >= warmup_steps_ && (step_ - warmup_steps_) % period_ == 0;
  average_step(averages ? 0 : -1, params);
  step_ += 1;
}

}  // namespace hsgd::distributed
