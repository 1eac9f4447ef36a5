#include "framework/distributed/model_averaging/hierarchical_model_averager.h"

#include <string>

#include "comm/error.h"
#include "comm/log.h"
#include "framework/distributed/model_averaging/config_check.h"

namespace hsgd::distributed {
namespace {

// "{2:2, 8:world}": the hierarchy as given, for messages.
std::string describe_given(const detail::Hierarchy& levels) {
  std::string out = "{";
  for (size_t i = 0; i < levels.size(); ++i) {
    out +=
        (i > 0 ? ", " : "") + std::to_string(levels[i].first) + ":" +
        (levels[i].second == kWholeGroup ? std::string("world") : std::to_string(levels[i].second));
  }
  return out + "}";
}

// The first problem with the hierarchy as given, or "" when it is valid for some world size;
// kWholeGroup (the whole group) counts as larger than any size. Each message names the
// offending entry (0-based index into period_group_size) and what was expected.
std::string validate_given(const detail::Hierarchy& levels, int64_t warmup_steps, int pg_size) {
  using hsgd::detail::str_cat;
  const char* who = "HierarchicalModelAverager";
  if (levels.empty()) {
    return str_cat(who, ": period_group_size must not be empty; give at least {period, ", pg_size,
                   "} or {period, 0} (0: the whole group)");
  }
  for (size_t i = 0; i < levels.size(); ++i) {
    const auto [period, size] = levels[i];
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
    const auto [prev_period, prev_size] = levels[i - 1];
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
  return "";
}

}  // namespace

detail::Hierarchy HierarchicalModelAverager::resolve(const detail::Hierarchy& given, int pg_size,
                                                     detail::Hierarchy* dropped) {
  detail::Hierarchy kept;
  for (const auto& [period, size] : given) {
    const int resolved = size == kWholeGroup ? pg_size : size;
    // Kept: the levels smaller than the group, then the first that is the whole group.
    const bool covered = !kept.empty() && kept.back().second == pg_size;
    if (resolved > pg_size || covered) {
      dropped->emplace_back(period, size);
    } else {
      kept.emplace_back(period, resolved);
    }
  }
  return kept;
}

HierarchicalModelAverager::HierarchicalModelAverager(
    std::vector<std::pair<int64_t, int>> period_group_size, int64_t warmup_steps,
    std::shared_ptr<comm::ProcessGroup> pg, ModelAveragerOptions options)
    : ModelAverager(std::move(pg), std::move(options), "HierarchicalModelAverager"),
      warmup_steps_(warmup_steps) {
  using hsgd::detail::str_cat;
  const int n = pg_->size();
  std::string error = validate_given(period_group_size, warmup_steps_, n);
  detail::Hierarchy dropped;
  if (error.empty()) {
    levels_ = resolve(period_group_size, n, &dropped);
    if (levels_.empty()) {
      error = str_cat(class_name_, ": every group size of ", describe_given(period_group_size),
                      " is larger than the process group size ", n,
                      "; give 0 (or 'world') as the last group size to mean the whole group");
    } else if (levels_.back().second != n) {
      error = str_cat(class_name_, ": last group size ", levels_.back().second,
                      " must equal the process group size ", n,
                      " (give 0, or 'world' in --hierarchy, to mean the whole group)");
    } else {
      // The sizes given nest; the whole group's size, now known, must nest too.
      for (size_t i = 1; i < levels_.size() && error.empty(); ++i) {
        if (levels_[i].second % levels_[i - 1].second != 0) {
          error = str_cat(class_name_, ": each group size must divide the next so that groups ",
                          "nest, but group size ", levels_[i - 1].second, " does not divide ",
                          levels_[i].second, " (", describe_given(period_group_size),
                          " in a process group of ", n, " ranks)");
        }
      }
    }
  }
  // Validate locally, but throw only after the collective check so that no rank leaves the
  // others waiting: either all ranks agree (and all see the same error) or all throw. The ranks
  // compare the hierarchy as given.
  detail::check_config_on_all_ranks(*pg_, class_name_, period_group_size, warmup_steps_, error);
  check_buffers_on_all_ranks();
  if (!dropped.empty() && pg_->rank() == 0) {
    comm::logger()->warn(
        "HierarchicalModelAverager (group '{}' of {} ranks): levels {} do not fit in the group "
        "(larger than it, or after a level that already covers it) and were dropped; averaging "
        "with {}",
        pg_->name(), n, describe_given(dropped), detail::describe(levels_));
  }
  if (levels_.back().first == 1) {
    comm::logger()->warn(
        "HierarchicalModelAverager (rank {} of group '{}'): the largest period is 1, so the "
        "whole group averages at every step, which costs no less than DDP's gradient "
        "allreduce; use DDP alone instead",
        pg_->rank(), pg_->name());
  }
  // Every rank creates the subgroups of every level in the same order (a collective).
  for (const auto& [period, size] : levels_) {
    if (size == n) {
      groups_.push_back(pg_);
    } else {
      groups_.push_back(comm::new_subgroups(pg_, size).first);
    }
    stats_.push_back(AveragingLevelStats{.period = period, .group_size = size});
    comm::logger()->debug("rank {}: every {} steps, groups of {} ranks average", pg_->rank(),
                          period, size);
  }
}

int HierarchicalModelAverager::level_at(int64_t step) const {
  if (step < warmup_steps_) return -1;
  for (int i = static_cast<int>(levels_.size()) - 1; i >= 0; --i) {
    if (step % levels_[i].first == 0) return i;
  }
  return -1;
}

void HierarchicalModelAverager::average_parameters(const std::vector<Tensor>& params) {
  const int level = level_at(step_);
  if (level >= 0) average_at_level(static_cast<size_t>(level), params, groups_[level].get());
  step_ += 1;
}

}  // namespace hsgd::distributed
