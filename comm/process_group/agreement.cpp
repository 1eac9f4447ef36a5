#include "comm/process_group/agreement.h"

#include <algorithm>
#include <cstdint>
#include <span>

#include "comm/error.h"
#include "comm/format_ranks.h"
#include "comm/process_group/detail/fnv1a.h"

namespace hsgd::comm {

std::vector<RanksWithValue> group_ranks_by_value(const std::vector<std::string>& values,
                                                 const std::vector<int>& ranks) {
  HSGD_CHECK(ranks.empty() || ranks.size() == values.size(), "group_ranks_by_value: ", ranks.size(),
             " ranks for ", values.size(), " values; expected one rank per value");
  std::vector<RanksWithValue> groups;
  for (size_t i = 0; i < values.size(); ++i) {
    const int rank = ranks.empty() ? static_cast<int>(i) : ranks[i];
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const RanksWithValue& g) { return g.value == values[i]; });
    if (it == groups.end()) {
      groups.push_back({.value = values[i], .ranks = {rank}});
    } else {
      it->ranks.push_back(rank);
    }
  }
  return groups;
}

std::vector<std::string> gather_if_different(ProcessGroup& pg, std::string_view description,
                                             std::string_view label) {
  if (pg.size() == 1) return {};
  const std::vector<int64_t> mine{static_cast<int64_t>(hsgd::detail::fnv1a(description)),
                                  static_cast<int64_t>(description.size())};
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(pg.size()));
  pg.allgather(std::span<const int64_t>(mine), std::span<int64_t>(all), label, RunOn::kCaller)
      ->wait(pg.work_timeout());
  bool same = true;
  for (size_t i = mine.size(); i < all.size(); ++i) same = same && all[i] == all[i % mine.size()];
  if (same) return {};
  // Every rank saw the same records, so every rank takes this path.
  std::vector<std::string> descriptions;
  pg.allgather_bytes(description, descriptions, label, RunOn::kCaller)->wait(pg.work_timeout());
  return descriptions;
}

void check_agreement(ProcessGroup& pg, std::string_view who, std::string_view what,
                     std::string_view description) {
  const std::vector<std::string> all =
      gather_if_different(pg, description, hsgd::str_cat(who, " agreement check"));
  if (all.empty()) return;
  std::string groups;
  for (const RanksWithValue& group : group_ranks_by_value(all)) {
    groups += hsgd::str_cat(" ranks ", hsgd::detail::format_ranks(group.ranks), " have ",
                            group.value, ";");
  }
  HSGD_THROW(InvalidArgument, who, ": the ranks of group '", pg.name(), "' passed different ", what,
             ":", groups, " every rank must pass the same (this is rank ", pg.rank(), ")");
}

}  // namespace hsgd::comm
