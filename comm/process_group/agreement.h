#pragma once
// Agreement checks: do all ranks of a group hold the same value, and if not, which ranks hold
// which. Components that must be configured identically on every rank (an averager's hierarchy,
// a model's parameters) check it once, collectively, before they communicate with it: a rank
// that disagrees would otherwise hang its peers or silently train something else.
//
// Every rank describes its value as a string; equal strings mean equal values, so a description
// must be exact (every field, numbers with enough digits to round-trip). The ranks compare a
// hash and the length of their descriptions first (one allgather of 2 int64 per rank); only
// when those differ do the descriptions themselves travel (ProcessGroup::allgather_bytes), so
// that every rank can name the groups of ranks holding each value.
//
// Usage:
//   check_agreement(*pg, "HierarchicalModelAverager", "configurations", "{2:2, 4:4} warm-up 0");
//
//   // Or, to write the message yourself from every rank's description:
//   std::vector<std::string> all = gather_if_different(*pg, "{2:2, 4:4}", "hierarchy check");
//   for (const RanksWithValue& group : group_ranks_by_value(all)) {
//     std::cout << group.value << " on " << group.ranks.size() << " ranks\n";
//   }

#include <string>
#include <string_view>
#include <vector>

#include "comm/process_group/process_group.h"

namespace hsgd::comm {

// The ranks that hold one value.
struct RanksWithValue {
  std::string value;
  std::vector<int> ranks;  // ascending when the input's ranks are
};

// values[i] is held by ranks[i], or by rank i when ranks is empty (ranks.size() must then equal
// values.size() otherwise). Returns the distinct values, each with the ranks holding it, in the
// order of their lowest rank. Local: no communication.
std::vector<RanksWithValue> group_ranks_by_value(const std::vector<std::string>& values,
                                                 const std::vector<int>& ranks = {});

// Collective over pg: every rank calls it with its own description. Returns every rank's
// description (indexed by group rank) when they are not all equal, and an empty vector when
// they are (always for a group of one). label names the collectives in failure reports. Throws
// hsgd::Timeout / hsgd::CommError when a collective fails.
std::vector<std::string> gather_if_different(ProcessGroup& pg, std::string_view description,
                                             std::string_view label);

// Collective over pg: every rank calls it with its own description of what must agree. Returns
// when all are equal; otherwise throws hsgd::InvalidArgument on EVERY rank (so no rank is left
// waiting in a later collective), e.g.
//   "PeriodicModelAverager: the ranks of group 'world' passed different configurations: ranks
//    [0, 2, 3] have {4:4} warm-up 0; ranks [1] have {8:4} warm-up 0; every rank must pass the
//    same (this is rank 1)"
// who names the caller; what is plural ("configurations"). Throws hsgd::Timeout /
// hsgd::CommError when a collective fails.
void check_agreement(ProcessGroup& pg, std::string_view who, std::string_view what,
                     std::string_view description);

}  // namespace hsgd::comm
