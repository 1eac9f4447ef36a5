#pragma once
// TwoLevelAllreduce: the allreduce plan of a group whose members span nodes (comm-internal):
// shared memory within each node, TCP between nodes. Used by ProcessGroup's kAuto allreduce when
// the members are on at least two nodes with the same number L of members each, 2 <= L <=
// ShmAllreduce::kMaxRanks, whatever the number of nodes.
//
// Plan: member i of a node (its i-th lowest group rank there) joins "cross group" i, which holds
// member i of every node. An allreduce then
//   1. reduces the whole buffer within each node, in shared memory;
//   2. allreduces shard i (of L) in cross group i over TCP, so the L cross groups share the
//      inter-node traffic and each crossing carries the buffer once instead of 2 (p-1)/p times;
//   3. keeps its shard, fills the rest with the op's identity, and reduces within the node once
//      more, which assembles the result (x + 0, min(x, +inf) and max(x, -inf) are exact, so every
//      rank gets the same bits).
//
// Usage (inside ProcessGroup::connect; not compiled: uses its private members):
//   two_level_ = TwoLevelAllreduce::connect(options_, identities);   // nullptr: not applicable
//   two_level_->allreduce(data, op);

#include <memory>
#include <span>
#include <vector>

#include "comm/process_group/process_group.h"

namespace hsgd::detail {

class TwoLevelAllreduce {
 public:
  // Collective over the members of the group with options `group`, given every member's node
  // identity (indexed by group rank). Every rank computes the same plan from the same
  // identities, and whether every node could map its segment is agreed through the store, so
  // it returns the plan on every rank or nullptr on every rank (members not on >= 2 nodes of the
  // same size in [2, ShmAllreduce::kMaxRanks], or a segment that could not be mapped). Throws
  // hsgd::Timeout naming the members that did not take part within the group's timeout.
  static std::unique_ptr<TwoLevelAllreduce> connect(const comm::ProcessGroup::Options& group,
                                                    const std::vector<comm::Bytes>& identities);
  ~TwoLevelAllreduce();
  TwoLevelAllreduce(const TwoLevelAllreduce&) = delete;
  TwoLevelAllreduce& operator=(const TwoLevelAllreduce&) = delete;

  // In place over the whole group, within the group's timeout; kAvg divides by the group size.
  // Same calls in the same order on every member (the group's contract).
  void allreduce(std::span<float> data, comm::ReduceOp op);
  void allreduce(std::span<double> data, comm::ReduceOp op);
  // Makes the allreduce running now fail at once (the group found its members in different
  // collectives); unusable afterwards. Thread-safe.
  void abort();

 private:
  TwoLevelAllreduce(std::unique_ptr<comm::ShmAllreduce> local,
                    std::shared_ptr<comm::ProcessGroup> cross, int index, int per_node,
                    int group_size, comm::Duration timeout);
  template <typename T>
  void allreduce_impl(std::span<T> data, comm::ReduceOp op);

  const std::unique_ptr<comm::ShmAllreduce> local_;  // the members on this node
  const std::shared_ptr<comm::ProcessGroup> cross_;  // member index_ of every node
  const int index_;                                  // this rank's position on its node
  const int per_node_;                               // members per node (L)
  const int group_size_;
  const comm::Duration timeout_;
};

}  // namespace hsgd::detail
