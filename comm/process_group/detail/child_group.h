#pragma once
// How a group's children are made (comm-internal): new_group / new_subgroups
// (comm/process_group/subgroups.h) and the cross-node groups of the two-level allreduce build their
// options here, in one place.

#include <memory>
#include <string>
#include <vector>

#include "comm/process_group/process_group.h"

namespace hsgd::detail {

// The options of a child of the group built from `parent`: named "<parent name>/<suffix>", key
// prefix "<parent prefix><suffix>/", members global_ranks (indexed by child rank), this process
// being child rank `rank`. Everything else (store, timeout, Gloo device, resources, allreduce
// algorithm, shared memory, local world size) is inherited from the parent.
comm::ProcessGroup::Options child_options(const comm::ProcessGroup::Options& parent,
                                          const std::string& suffix, int rank,
                                          std::vector<int> global_ranks);

// The child of parent made of the given parent ranks (valid and distinct; the caller checks),
// or nullptr on a rank that is not a member. Collective over parent: every parent rank takes the
// parent's next child id, members or not, so the same child gets the same id, name ("<parent
// name>/g<id>") and key prefix on every rank. A friend of ProcessGroup (reads the parent's
// options and child counter).
std::shared_ptr<comm::ProcessGroup> make_child_group(
    const std::shared_ptr<comm::ProcessGroup>& parent, std::vector<int> parent_ranks);

}  // namespace hsgd::detail
