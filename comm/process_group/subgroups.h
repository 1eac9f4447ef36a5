#pragma once
// Subgroups of a ProcessGroup (like torch's new_group / new_subgroups).
//
// CONTRACT: every rank of the parent calls these functions, in the same order, with the same
// arguments, including ranks that end up in no group: a per-parent counter names each group's
// key prefix, so a skipped call would mismatch every later group. Creating a group blocks until
// its members connected (bounded by the parent's timeout).
//
// Ranks given here are ranks of the parent (the global ranks when the parent is the world, as in
// torch). A group's rank order is the sorted order of its ranks.
//
// Usage (8 ranks, 2 nodes of 4):
//   auto [node, nodes] = hsgd::comm::new_subgroups(world, 4);   // node: {0..3} or {4..7}
//   auto evens = hsgd::comm::new_group(world, {0, 2, 4, 6});     // nullptr on odd ranks

#include <memory>
#include <utility>
#include <vector>

namespace hsgd::comm {

class ProcessGroup;

// A group of the given parent ranks. Returns nullptr on ranks that are not members (torch's
// NON_GROUP_MEMBER). Throws hsgd::InvalidArgument for an empty list, a duplicate, or a rank
// outside [0, parent->size()).
std::shared_ptr<ProcessGroup> new_group(const std::shared_ptr<ProcessGroup>& parent,
                                        std::vector<int> ranks);

// Splits the parent into parent->size() / group_size groups of contiguous ranks. Returns this
// rank's group and all groups in order (entries of groups this rank is not in are nullptr).
// Throws hsgd::InvalidArgument unless 0 < group_size and group_size divides parent->size().
std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>> new_subgroups(
    const std::shared_ptr<ProcessGroup>& parent, int group_size);

// One group per list, in the given order. A rank may appear in at most one list; a rank in none
// gets nullptr as its own group. Throws hsgd::InvalidArgument for an empty list, a repeated
// rank or a rank outside the parent.
std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>>
new_subgroups_by_enumeration(const std::shared_ptr<ProcessGroup>& parent,
                             const std::vector<std::vector<int>>& rank_lists);

}  // namespace hsgd::comm
