#include "comm/process_group/subgroups.h"

#include "comm/error.h"
#include "comm/process_group/detail/child_group.h"
#include "comm/process_group/process_group.h"

namespace hsgd::comm {
namespace {

// Checks that ranks are valid parent ranks, each at most once (seen spans every list).
void check_ranks(const ProcessGroup& parent, const std::vector<int>& ranks, std::vector<bool>& seen,
                 const char* who) {
  HSGD_CHECK(!ranks.empty(), who, ": a group needs at least one rank (parent '", parent.name(),
             "')");
  for (int r : ranks) {
    HSGD_CHECK(r >= 0 && r < parent.size(), who, ": rank ", r, " is not a rank of parent '",
               parent.name(), "' (expected [0, ", parent.size(), "))");
    HSGD_CHECK(!seen[static_cast<size_t>(r)], who, ": rank ", r, " is listed twice");
    seen[static_cast<size_t>(r)] = true;
  }
}

}  // namespace

std::shared_ptr<ProcessGroup> new_group(const std::shared_ptr<ProcessGroup>& parent,
                                        std::vector<int> ranks) {
  HSGD_CHECK(parent != nullptr, "new_group: parent group is null");
  std::vector<bool> seen(static_cast<size_t>(parent->size()), false);
  check_ranks(*parent, ranks, seen, "new_group");
  return hsgd::detail::make_child_group(parent, std::move(ranks));
}

std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>> new_subgroups(
    const std::shared_ptr<ProcessGroup>& parent, int group_size) {
  HSGD_CHECK(parent != nullptr, "new_subgroups: parent group is null");
  HSGD_CHECK(group_size > 0 && parent->size() % group_size == 0, "new_subgroups: group_size ",
             group_size, " must be positive and divide the size ", parent->size(), " of group '",
             parent->name(), "'");
  std::vector<std::vector<int>> lists(static_cast<size_t>(parent->size() / group_size));
  for (int r = 0; r < parent->size(); ++r) lists[static_cast<size_t>(r / group_size)].push_back(r);
  return new_subgroups_by_enumeration(parent, lists);
}

std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>>
new_subgroups_by_enumeration(const std::shared_ptr<ProcessGroup>& parent,
                             const std::vector<std::vector<int>>& rank_lists) {
  HSGD_CHECK(parent != nullptr, "new_subgroups_by_enumeration: parent group is null");
  HSGD_CHECK(!rank_lists.empty(), "new_subgroups_by_enumeration: no rank lists given");
  // Validate everything before creating any group, so that a bad list fails on every rank
  // alike instead of leaving some ranks waiting in a connect.
  std::vector<bool> seen(static_cast<size_t>(parent->size()), false);
  for (const auto& ranks : rank_lists) {
    check_ranks(*parent, ranks, seen, "new_subgroups_by_enumeration");
  }
  std::shared_ptr<ProcessGroup> mine;
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  for (const auto& ranks : rank_lists) {
    groups.push_back(hsgd::detail::make_child_group(parent, ranks));
    if (groups.back()) mine = groups.back();
  }
  return {mine, groups};
}

}  // namespace hsgd::comm
