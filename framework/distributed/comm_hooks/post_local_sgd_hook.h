#pragma once
// Post-local SGD DDP hook (torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook).
//
// For the first start_localSGD_iter iterations the hook averages gradients over process_group
// (plain DDP). Afterwards it averages them only within subgroup (normally the ranks of one node,
// where communication is cheap), or not at all when post_local_gradient_allreduce is false; a
// model averager run after optimizer.step() (PeriodicModelAverager, HierarchicalModelAverager)
// then keeps the replicas close. iter counts the iterations (it advances on the last bucket).
//
// process_group is required (there is no default group in hsgd). A null subgroup means the
// intra-node group: the ranks of process_group on this rank's node (see intra_node_subgroup;
// LOCAL_WORLD_SIZE contiguous ranks when every node runs the same number, as in torch), created
// when the hook is registered with DistributedDataParallel::register_comm_hook (a collective on
// every rank), never lazily during backward.
//
// Usage:
//   auto state = std::make_shared<hsgd::distributed::PostLocalSGDState>(
//       hsgd::distributed::PostLocalSGDState{.process_group = pg, .start_localSGD_iter = 100});
//   ddp.register_comm_hook(state, hsgd::distributed::post_localSGD_hook);
//   auto averager = std::make_shared<PeriodicModelAverager>(4, /*warmup_steps=*/100, pg);

#include <cstdint>
#include <memory>

#include "comm/process_group/process_group.h"
#include "framework/distributed/grad_bucket.h"
#include "framework/train/state_dict.h"

namespace hsgd::distributed {

struct PostLocalSGDState {
  std::shared_ptr<comm::ProcessGroup> process_group = nullptr;
  std::shared_ptr<comm::ProcessGroup> subgroup = nullptr;
  int64_t start_localSGD_iter = 0;
  bool post_local_gradient_allreduce = true;
  int64_t iter = 0;

  // For checkpoints: "iter" (int64); the groups and options are the program's to rebuild.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);
};

std::shared_ptr<comm::Work> post_localSGD_hook(PostLocalSGDState& state, GradBucket& bucket);

// The intra-node subgroup of pg, from the node layout the launcher declared (LOCAL_WORLD_SIZE
// and GROUP_RANK as set by hsgd-run and torchrun, kept by the process group from InitOptions;
// comm/process_group/node_layout.h). Collective over pg (one small allgather, then the group
// creation):
// - every member declared the same LOCAL_WORLD_SIZE L dividing pg's size: contiguous groups of
//   L ranks (torch's new_subgroups(L), unchanged), pg itself when L == pg's size;
// - nodes with different numbers of ranks (hsgd-run --nproc-per-node 3 on one node, 1 on
//   another): each node's actual members, {0, 1, 2} and {3} (new_subgroups_by_enumeration);
// - nothing declared: pg itself (one node).
// InvalidArgument on every rank when the layout cannot be told (NodeLayout::nodes), e.g. a
// LOCAL_WORLD_SIZE that does not divide pg's size and no GROUP_RANK to group the ranks by.
std::shared_ptr<comm::ProcessGroup> intra_node_subgroup(
    const std::shared_ptr<comm::ProcessGroup>& pg);

// Called by register_comm_hook: checks the state and creates the intra-node subgroup if null.
void init_comm_hook_state(PostLocalSGDState& state,
                          const std::shared_ptr<comm::ProcessGroup>& ddp_group);

}  // namespace hsgd::distributed
