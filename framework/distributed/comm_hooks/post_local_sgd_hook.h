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
// intra-node group: LOCAL_WORLD_SIZE contiguous ranks of process_group (the node layout the
// process group keeps, see intra_node_subgroup), created when the hook is registered with
// DistributedDataParallel::register_comm_hook (a collective on every rank), never lazily during
// backward.
//
// Usage:
//   auto state = std::make_shared<hsgd::distributed::PostLocalSGDState>(
//       hsgd::distributed::PostLocalSGDState{.process_group = pg, .start_localSGD_iter = 100});
//   ddp.register_comm_hook(state, hsgd::distributed::post_localSGD_hook);
//   auto averager = std::make_shared<PeriodicModelAverager>(4, /*warmup_steps=*/100, pg);

#include <cstdint>
#include <memory>

#include "comm/process_group.h"
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

// The intra-node subgroup of pg: contiguous groups of pg->local_world_size() ranks (the job's
// LOCAL_WORLD_SIZE as set by hsgd-run and torchrun, kept by the process group from
// InitOptions::local_world_size), or pg itself when that is not declared (0). Collective over
// pg. InvalidArgument when the value does not divide pg's size.
std::shared_ptr<comm::ProcessGroup> intra_node_subgroup(
    const std::shared_ptr<comm::ProcessGroup>& pg);

// Called by register_comm_hook: checks the state and creates the intra-node subgroup if null.
void init_comm_hook_state(PostLocalSGDState& state,
                          const std::shared_ptr<comm::ProcessGroup>& ddp_group);

}  // namespace hsgd::distributed
