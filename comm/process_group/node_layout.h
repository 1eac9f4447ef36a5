#pragma once
// NodeLayout: which members of a process group run on which node, as the launcher declared it
// (each rank's GROUP_RANK and LOCAL_WORLD_SIZE, kept by the world group as
// ProcessGroup::node_rank() and local_world_size(), inherited by subgroups).
//
// Why a collective: hsgd-run lets nodes run different numbers of ranks (--nproc-per-node 3 on
// one node, 1 on another), so a rank cannot infer its node's members from its own
// LOCAL_WORLD_SIZE (rank 3 of a 3 + 1 job sees 1, the others 3). gather_node_layout asks every
// member once; every rank then holds the same layout, so decisions taken from it (which
// subgroups to create, which error to throw) are the same on every rank.
//
// hsgd-run, torchrun and srun's default block distribution number a node's ranks contiguously,
// nodes in node-rank order; nodes() does not rely on it when node ranks are declared.
//
// Usage (3 + 1 ranks under hsgd-run):
//   const hsgd::comm::NodeLayout layout = hsgd::comm::gather_node_layout(*world);  // collective
//   layout.nodes();                     // {{0, 1, 2}, {3}}
//   layout.uniform_local_world_size();  // -1: the nodes run different numbers of ranks
//   auto [node, all] = hsgd::comm::new_subgroups_by_enumeration(world, layout.nodes());

#include <string>
#include <vector>

namespace hsgd::comm {

class ProcessGroup;

struct NodeLayout {
  std::string group_name;              // for messages
  std::vector<int> node_ranks;         // by group rank: the node each member declared (-1: none)
  std::vector<int> local_world_sizes;  // by group rank: its LOCAL_WORLD_SIZE (0: none)

  // The LOCAL_WORLD_SIZE every member declared (0 when none did), or -1 when they differ.
  int uniform_local_world_size() const;

  // The members of each node (group ranks, ascending), nodes by ascending node rank:
  // - every member declared its node: grouped by node rank. InvalidArgument when the members of
  //   a node declared different LOCAL_WORLD_SIZEs, or a node has more members than declared.
  // - no member declared its node: contiguous groups of the LOCAL_WORLD_SIZE they all declared,
  //   or one node (the whole group) when none was declared. InvalidArgument when the sizes
  //   differ or do not divide the group size (the nodes cannot be told apart without GROUP_RANK).
  // - some did and some did not: InvalidArgument naming the ranks without a node.
  std::vector<std::vector<int>> nodes() const;
};

// Collective over pg (every member calls it, in the same order as pg's other collectives): one
// allgather of (node rank, LOCAL_WORLD_SIZE) per member, bounded by pg's timeout.
NodeLayout gather_node_layout(ProcessGroup& pg);

}  // namespace hsgd::comm
