#include "framework/distributed/comm_hooks/post_local_sgd_hook.h"

#include <string>
#include <vector>

#include "comm/error.h"
#include "comm/log.h"
#include "framework/distributed/comm_hooks/default_hooks.h"

namespace hsgd::distributed {

std::shared_ptr<comm::ProcessGroup> intra_node_subgroup(
    const std::shared_ptr<comm::ProcessGroup>& pg) {
  HSGD_CHECK(pg != nullptr, "intra_node_subgroup: process group is null");
  // Every member's declared layout, not this rank's alone: in a 3 + 1 job rank 3 declares
  // LOCAL_WORLD_SIZE 1, which divides 4, while the others declare 3.
  const comm::NodeLayout layout = comm::gather_node_layout(*pg);
  const int local_world_size = layout.uniform_local_world_size();
  if (local_world_size == 0 || local_world_size == pg->size()) return pg;  // one node
  if (local_world_size > 0 && pg->size() % local_world_size == 0) {
    return comm::new_subgroups(pg, local_world_size).first;  // equal nodes: torch's groups
  }
  std::vector<std::vector<int>> nodes;
  try {
    nodes = layout.nodes();
  } catch (const InvalidArgument& e) {
    HSGD_THROW(
        InvalidArgument, "intra_node_subgroup: LOCAL_WORLD_SIZE ",
        local_world_size > 0 ? std::to_string(local_world_size) : "(different per rank)",
        " (the process group's local_world_size) must divide the size ", pg->size(),
        " of process group '", pg->name(),
        "', or every rank must declare its node (GROUP_RANK) to group ranks by node: ", e.what());
  }
  if (nodes.size() == 1) return pg;
  return comm::new_subgroups_by_enumeration(pg, nodes).first;
}

void init_comm_hook_state(PostLocalSGDState& state,
                          const std::shared_ptr<comm::ProcessGroup>& ddp_group) {
  HSGD_CHECK(state.process_group != nullptr,
             "PostLocalSGDState: process_group is required (hsgd has no default group); pass "
             "the group DDP runs on");
  HSGD_CHECK(state.start_localSGD_iter >= 0,
             "PostLocalSGDState: start_localSGD_iter must be >= 0, got ",
             state.start_localSGD_iter);
  (void)ddp_group;
  if (state.subgroup == nullptr) state.subgroup = intra_node_subgroup(state.process_group);
  comm::logger()->debug("rank {}: local SGD starts after {} iterations (subgroup of {} ranks)",
                        state.process_group->rank(), state.start_localSGD_iter,
                        state.subgroup->size());
}

std::shared_ptr<comm::Work> post_localSGD_hook(PostLocalSGDState& state, GradBucket& bucket) {
  if (state.iter < state.start_localSGD_iter) {
    if (bucket.is_last()) ++state.iter;
    HSGD_CHECK(state.process_group != nullptr, "post_localSGD_hook: process_group is null");
    return allreduce_hook(*state.process_group, bucket);
  }
  if (!state.post_local_gradient_allreduce) return nullptr;  // purely local gradients
  HSGD_CHECK(state.subgroup != nullptr,
             "post_localSGD_hook: subgroup is null; register the hook with "
             "DistributedDataParallel::register_comm_hook, which creates the intra-node group");
  return allreduce_hook(*state.subgroup, bucket);
}

StateDict PostLocalSGDState::state_dict() const {
  StateDict state;
  state.set("iter", iter);
  return state;
}

void PostLocalSGDState::load_state_dict(const StateDict& state) {
  const int64_t restored = state.get_int("iter");
  HSGD_CHECK_GE(restored, 0, "PostLocalSGDState::load_state_dict: iter");
  iter = restored;
}

}  // namespace hsgd::distributed
