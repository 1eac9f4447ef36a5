#include "framework/distributed/model_averaging/hierarchical_model_averager.h"

#include <string>

#include "comm/error.h"
#include "comm/log.h"
#include "framework/distributed/model_averaging/config_check.h"

namespace hsgd::distributed {
namespace {

// The first problem with the hierarchy as given, or "" when it is valid for some world size;
// kWholeGroup (the whole group) counts as larger than any size. Each message names the
// offending entry (0-based index into period_group_size) and what was expected.
std::string validate_given(const std::vector<LevelOptions>& levels, int64_t warmup_steps,
                           int pg_size) {
  using hsgd::detail::str_cat;
  const char* who = "HierarchicalModelAverager";
  if (levels.empty()) {
    return str_cat(who, ": period_group_size must not be empty; give at least {period, ", pg_size,
                   "} or {period, 0} (0: the whole group)");
  }
  for (size_t i = 0; i < levels.size(); ++i) {
    const int64_t period = levels[i].period;
    const int size = levels[i].group_size;
    if (period < 1) {
      return str_cat(who, ": period of entry ", i, " must be >= 1, got ", period);
    }
    if (size < 0) {
      return str_cat(who, ": group size of entry ", i,
                     " must be >= 1, or 0 for the whole group, got ", size);
    }
    if (size == kWholeGroup && i + 1 != levels.size()) {
      return str_cat(who, ": group size 0 (the whole group) of entry ", i,
                     " must be the last entry, but ", levels.size() - i - 1, " entries follow");
    }
    if (i == 0) continue;
    const int64_t prev_period = levels[i - 1].period;
    const int prev_size = levels[i - 1].group_size;
    if (period <= prev_period) {
      return str_cat(who, ": periods must strictly increase, but entry ", i, " has period ", period,
                     " after period ", prev_period, " of entry ", i - 1);
    }
    if (size == kWholeGroup) continue;
    if (size <= prev_size) {
      return str_cat(who, ": group sizes must strictly increase, but entry ", i, " has group size ",
                     size, " after group size ", prev_size, " of entry ", i - 1);
    }
    if (size % prev_size != 0) {
      return str_cat(who, ": each group size must divide the next so that groups nest, but ",
                     "group size ", prev_size, " of entry ", i - 1, " does not divide ", size,
                     " of entry ", i);
    }
  }
  if (warmup_steps < 0) return str_cat(who, ": warmup_steps must be >= 0, got ", warmup_steps);
  for (size_t i = 0; i < levels.size(); ++i) {
    std::string error = validate_options(levels[i], i, who);
    if (!error.empty()) return error;
  }
  return "";
}

std::vector<LevelOptions> plain_levels(const std::vector<std::pair<int64_t, int>>& pairs) {
  std::vector<LevelOptions> levels;
  for (const auto& [period, size] : pairs) {
    levels.push_back(LevelOptions{.period = period, .group_size = size});
  }
  return levels;
}

}  // namespace

std::vector<LevelOptions> HierarchicalModelAverager::resolve(const std::vector<LevelOptions>& given,
                                                             int pg_size,
                                                             std::vector<LevelOptions>* dropped) {
  std::vector<LevelOptions> kept;
  for (const LevelOptions& level : given) {
    const int resolved = level.group_size == kWholeGroup ? pg_size : level.group_size;
    // Kept: the levels smaller than the group, then the first that is the whole group.
    const bool covered = !kept.empty() && kept.back().group_size == pg_size;
    if (resolved > pg_size || covered) {
      dropped->push_back(level);
    } else {
      kept.push_back(level);
      kept.back().group_size = resolved;
    }
  }
  return kept;
}

HierarchicalModelAverager::HierarchicalModelAverager(
    std::vector<std::pair<int64_t, int>> period_group_size, int64_t warmup_steps,
    std::shared_ptr<comm::ProcessGroup> pg, ModelAveragerOptions options)
    : HierarchicalModelAverager(plain_levels(period_group_size), warmup_steps, std::move(pg),
                                std::move(options)) {}

HierarchicalModelAverager::HierarchicalModelAverager(
    std::initializer_list<std::pair<int64_t, int>> period_group_size, int64_t warmup_steps,
    std::shared_ptr<comm::ProcessGroup> pg, ModelAveragerOptions options)
    : HierarchicalModelAverager(std::vector<std::pair<int64_t, int>>(period_group_size),
                                warmup_steps, std::move(pg), std::move(options)) {}

HierarchicalModelAverager::HierarchicalModelAverager(std::vector<LevelOptions> given,
                                                     int64_t warmup_steps,
                                                     std::shared_ptr<comm::ProcessGroup> pg,
                                                     ModelAveragerOptions options)
    : ModelAverager(std::move(pg), std::move(options), "HierarchicalModelAverager"),
      warmup_steps_(warmup_steps) {
  using hsgd::detail::str_cat;
  const int n = pg_->size();
  std::string error = validate_given(given, warmup_steps_, n);
  std::vector<LevelOptions> levels, dropped;
  if (error.empty()) {
    levels = resolve(given, n, &dropped);
    if (levels.empty()) {
      error = str_cat(class_name_, ": every group size of ", detail::describe(given),
                      " is larger than the process group size ", n,
                      "; give 0 (or 'world') as the last group size to mean the whole group");
    } else if (levels.back().group_size != n) {
      error = str_cat(class_name_, ": last group size ", levels.back().group_size,
                      " must equal the process group size ", n,
                      " (give 0, or 'world' in --hierarchy, to mean the whole group)");
    } else {
      // The sizes given nest; the whole group's size, now known, must nest too.
      for (size_t i = 1; i < levels.size() && error.empty(); ++i) {
        if (levels[i].group_size % levels[i - 1].group_size != 0) {
          error = str_cat(class_name_, ": each group size must divide the next so that groups ",
                          "nest, but group size ", levels[i - 1].group_size, " does not divide ",
                          levels[i].group_size, " (", detail::describe(given),
                          " in a process group of ", n, " ranks)");
        }
      }
    }
  }
  // Validate locally, but throw only after the collective check so that no rank leaves the
  // others waiting: either all ranks agree (and all see the same error) or all throw. The ranks
  // compare the hierarchy as given.
  detail::check_config_on_all_ranks(*pg_, class_name_, given, warmup_steps_, error);
  check_buffers_on_all_ranks();
  if (!dropped.empty() && pg_->rank() == 0) {
    comm::logger()->warn(
        "HierarchicalModelAverager (group '{}' of {} ranks): levels {} do not fit in the group "
        "(larger than it, or after a level that already covers it) and were dropped; averaging "
        "with {}",
        pg_->name(), n, detail::describe(dropped), detail::describe(levels));
  }
  if (levels.back().period == 1) {
    comm::logger()->warn(
        "HierarchicalModelAverager (rank {} of group '{}'): the largest period is 1, so the "
        "whole group averages at every step, which costs no less than DDP's gradient "
        "allreduce; use DDP alone instead",
        pg_->rank(), pg_->name());
  }
  // Every rank creates the subgroups of every level in the same order (a collective).
  for (const LevelOptions& level : levels) {
    period_group_size_.emplace_back(level.period, level.group_size);
    if (level.group_size == n) {
      groups_.push_back(pg_);
    } else {
      groups_.push_back(comm::new_subgroups(pg_, level.group_size).first);
    }
    add_level(level, groups_.back());
    comm::logger()->debug("rank {}: every {} steps, groups of {} ranks average ({})", pg_->rank(),
                          level.period, level.group_size, describe(level));
  }
}

int HierarchicalModelAverager::level_at(int64_t step) const {
  if (step < warmup_steps_) return -1;
  for (int i = static_cast<int>(period_group_size_.size()) - 1; i >= 0; --i) {
    if (step % period_group_size_[i].first == 0) return i;
  }
  return -1;
}

void HierarchicalModelAverager::average_parameters(const std::vector<Tensor>& params) {
  average_step(level_at(step_), params);
  step_ += 1;
}

}  // namespace hsgd::distributed
