#include "framework/distributed/model_averaging/hierarchical_model_averager.h"

#include <string>

#include "comm/error.h"
#include "comm/format_ranks.h"
#include "comm/log.h"
#include "framework/distributed/model_averaging/config_check.h"

namespace hsgd::distributed {
namespace {

// The first problem with the hierarchy as given, or "" when it is valid for some world size;
// kWholeGroup (the whole group) counts as larger than any size. Each message names the
// offending entry (0-based index into period_group_size) and what was expected.
std::string validate_given(const std::vector<LevelOptions>& levels, int64_t warmup_steps,
                           int pg_size) {
  using hsgd::str_cat;
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
    if (size < 0 && size != kNodeGroup) {
      return str_cat(who, ": group size of entry ", i,
                     " must be >= 1, or 0 for the whole group, or -1 (kNodeGroup, 'node') for "
                     "each node's ranks, got ",
                     size);
    }
    if (size == kWholeGroup && i + 1 != levels.size()) {
      return str_cat(who, ": group size 0 (the whole group) of entry ", i,
                     " must be the last entry, but ", levels.size() - i - 1, " entries follow");
    }
    if (i == 0) continue;
    const int64_t prev_period = levels[i - 1].period;
    if (period <= prev_period) {
      return str_cat(who, ": periods must strictly increase, but entry ", i, " has period ", period,
                     " after period ", prev_period, " of entry ", i - 1);
    }
    if (size == kWholeGroup || size == kNodeGroup) continue;
    // Sizes compare with the previous numeric size; node levels nest-check once the nodes are
    // known (check_nesting).
    size_t prev = i - 1;
    while (prev > 0 && levels[prev].group_size == kNodeGroup) --prev;
    const int prev_size = levels[prev].group_size;
    if (prev_size == kNodeGroup) continue;
    if (size <= prev_size) {
      return str_cat(who, ": group sizes must strictly increase, but entry ", i, " has group size ",
                     size, " after group size ", prev_size, " of entry ", prev);
    }
    if (size % prev_size != 0) {
      return str_cat(who, ": each group size must divide the next so that groups nest, but ",
                     "group size ", prev_size, " of entry ", prev, " does not divide ", size,
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

bool has_node_level(const std::vector<LevelOptions>& levels) {
  for (const LevelOptions& level : levels) {
    if (level.group_size == kNodeGroup) return true;
  }
  return false;
}

// The groups (ranks of the process group) of a resolved level: contiguous groups of its size,
// or the nodes.
std::vector<std::vector<int>> groups_of(const LevelOptions& level, int pg_size,
                                        const std::vector<std::vector<int>>& nodes) {
  if (level.group_size == kNodeGroup) return nodes;
  std::vector<std::vector<int>> groups(static_cast<size_t>(pg_size / level.group_size));
  for (int r = 0; r < pg_size; ++r) groups[static_cast<size_t>(r / level.group_size)].push_back(r);
  return groups;
}

// "[0, 1] [2, 3]".
std::string format_groups(const std::vector<std::vector<int>>& groups) {
  std::string out;
  for (const auto& group : groups) {
    if (!out.empty()) out += ' ';
    out += hsgd::detail::format_ranks(group);
  }
  return out;
}

// With node levels, sizes alone do not say whether groups nest: the first group of a level not
// inside one group of the next level, or "" when they nest. levels are resolved (sizes >= 1 or
// kNodeGroup, the last pg_size).
std::string check_nesting(const std::vector<LevelOptions>& levels, int pg_size,
                          const std::vector<std::vector<int>>& nodes, const std::string& where) {
  using hsgd::str_cat;
  const char* who = "HierarchicalModelAverager";
  for (const LevelOptions& level : levels) {
    if (level.group_size != kNodeGroup && pg_size % level.group_size != 0) {
      return str_cat(who, ": group size ", level.group_size, " of level ", describe(level),
                     " must divide the process group size ", pg_size, where);
    }
  }
  for (size_t i = 1; i < levels.size(); ++i) {
    const auto inner = groups_of(levels[i - 1], pg_size, nodes);
    const auto outer = groups_of(levels[i], pg_size, nodes);
    std::vector<size_t> owner(static_cast<size_t>(pg_size));
    for (size_t g = 0; g < outer.size(); ++g) {
      for (int r : outer[g]) owner[static_cast<size_t>(r)] = g;
    }
    for (const auto& group : inner) {
      for (int r : group) {
        if (owner[static_cast<size_t>(r)] == owner[static_cast<size_t>(group.front())]) continue;
        return str_cat(who, ": groups must nest, but group ", format_groups({group}), " of level ",
                       describe(levels[i - 1]), " is split between groups ",
                       format_groups({outer[owner[static_cast<size_t>(group.front())]],
                                      outer[owner[static_cast<size_t>(r)]]}),
                       " of level ", describe(levels[i]), where);
      }
    }
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

std::vector<LevelOptions> HierarchicalModelAverager::resolve(
    const std::vector<LevelOptions>& given, int pg_size, const std::vector<std::vector<int>>& nodes,
    std::vector<LevelOptions>* dropped) {
  std::vector<LevelOptions> kept;
  for (const LevelOptions& level : given) {
    int resolved = level.group_size;
    // One node holding the whole group: its level is the whole group.
    if (resolved == kWholeGroup || (resolved == kNodeGroup && nodes.size() == 1)) {
      resolved = pg_size;
    }
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
  using hsgd::str_cat;
  const int n = pg_->size();
  // Validate locally, but throw only after the collective check so that no rank leaves the
  // others waiting: either all ranks agree (and all see the same error) or all throw. The ranks
  // compare the hierarchy as given.
  detail::check_config_on_all_ranks(*pg_, class_name_, given, warmup_steps_,
                                    validate_given(given, warmup_steps_, n));
  // From here every rank holds the same hierarchy and (collectively gathered) the same nodes, so
  // every decision below, errors included, is the same on every rank.
  std::vector<std::vector<int>> nodes;
  std::string where;  // the nodes, for messages
  if (has_node_level(given)) {
    try {
      nodes = comm::gather_node_layout(*pg_).nodes();
    } catch (const InvalidArgument& e) {
      HSGD_THROW(InvalidArgument, class_name_, ": ", detail::describe(given),
                 " groups ranks by node, but ", e.what());
    }
    where = str_cat(" (", detail::describe(given), " in process group '", pg_->name(), "' of ", n,
                    " ranks on nodes ", format_groups(nodes), ")");
  }
  std::vector<LevelOptions> levels, dropped;
  std::string error;
  levels = resolve(given, n, nodes, &dropped);
  if (levels.empty()) {
    error = str_cat(class_name_, ": every group size of ", detail::describe(given),
                    " is larger than the process group size ", n,
                    "; give group size 0 (kWholeGroup) to the last level to mean the whole "
                    "group");
  } else if (levels.back().group_size == kNodeGroup) {
    error = str_cat(class_name_, ": the last level ", describe(levels.back()),
                    " averages within each node, but the last level must be the whole process "
                    "group of ",
                    n, " ranks (give group size 0, kWholeGroup, to the last level)", where);
  } else if (levels.back().group_size != n && !dropped.empty()) {
    // The last entry given did not fit and was dropped: name it, not the level that is left.
    std::string entries;
    for (size_t i = 0; i < given.size(); ++i) {
      if (given[i].group_size <= n) continue;
      entries += str_cat(entries.empty() ? "" : ", ", "entry ", i, " (", describe(given[i]), ")");
    }
    error = str_cat(
        class_name_, ": ", entries, " of ", detail::describe(given),
        dropped.size() == 1 ? " does" : " do", " not fit in the process group of ", n,
        " ranks (group size larger than ", n, ") and", dropped.size() == 1 ? " was" : " were",
        " dropped, which leaves the last level ", describe(levels.back()), " whose group size ",
        levels.back().group_size, " must equal the process group size ", n,
        "; give the last entry group size ", n, " or 0 (kWholeGroup, the whole group)");
  } else if (levels.back().group_size != n) {
    error = str_cat(class_name_, ": last group size ", levels.back().group_size,
                    " must equal the process group size ", n,
                    " (group size 0, kWholeGroup, means the whole group)");
  } else if (!nodes.empty()) {
    error = check_nesting(levels, n, nodes, where);
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
  if (!error.empty()) HSGD_THROW(InvalidArgument, error);
  check_buffers_on_all_ranks();
  if (!dropped.empty() && pg_->rank() == 0) {
    // On one machine a 'node' level is the whole group: say how to test the hierarchy there.
    const std::string one_node =
        nodes.size() == 1 && n > 1
            ? str_cat("; 'node' is the whole group here, all ", n,
                      " ranks being on one node: to test the hierarchy on one machine, emulate "
                      "nodes (runtime::ParallelOptions::emulated_node_size, --emulated-node-size "
                      "in the examples) or give the lower level a number")
            : std::string();
    comm::logger()->warn(
        "HierarchicalModelAverager (group '{}' of {} ranks): levels {} do not fit in the group "
        "(larger than it, or after a level that already covers it) and were dropped; averaging "
        "with {}{}",
        pg_->name(), n, detail::describe(dropped), detail::describe(levels), one_node);
    for (const LevelOptions& level : dropped) {
      if (is_plain(level)) continue;
      // A dropped level takes its options with it: name them, the top level kept does not get
      // them (it may be plain: an outer optimizer asked for would then never run).
      const std::string text = describe(level);
      comm::logger()->warn(
          "HierarchicalModelAverager (group '{}' of {} ranks): the options {} of the dropped "
          "level {} are not applied; the top level kept is {}",
          pg_->name(), n, text.substr(text.find('@') + 1), text, describe(levels.back()));
    }
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
    } else if (level.group_size == kNodeGroup) {
      groups_.push_back(comm::new_subgroups_by_enumeration(pg_, nodes).first);
    } else {
      groups_.push_back(comm::new_subgroups(pg_, level.group_size).first);
    }
    add_level(level, groups_.back());
    comm::logger()->debug("rank {}: every {} steps, groups of {} ranks average ({})", pg_->rank(),
                          level.period, groups_.back()->size(), describe(level));
  }
}

int HierarchicalModelAverager::level_at(int64_t step) const {
  if (step < warmup_steps_) return -1;
  for (int i = static_cast<int>(period_group_size_.size()) - 1; i >= 0; --i) {
    if (step % period_group_size_[i].first == 0) return i;
  }
  return -1;
}

bool HierarchicalModelAverager::fragment_starts(size_t level, int64_t offset, int64_t step) const {
  if (step < warmup_steps_ || step % period_group_size_.at(level).first != offset) return false;
  return level_at(step) <= static_cast<int>(level);
}

void HierarchicalModelAverager::average_parameters(const std::vector<Tensor>& params) {
  average_step(level_at(step_), params);
  step_ += 1;
}

}  // namespace hsgd::distributed
