#include "framework/distributed/comm_hooks/post_local_sgd_hook.h"

#include <string>

#include "comm/error.h"
#include "comm/log.h"
#include "framework/distributed/comm_hooks/default_hooks.h"

namespace hsgd::distributed {

std::shared_ptr<comm::ProcessGroup> intra_node_subgroup(
    const std::shared_ptr<comm::ProcessGroup>& pg) {
  HSGD_CHECK(pg != nullptr, "intra_node_subgroup: process group is null");
  // The node layout is the job's, as the launcher declared it (LOCAL_WORLD_SIZE, read once by
  // InitOptions::from_env and kept by the process group); not declared: one node.
  const int local_world_size = pg->local_world_size() > 0 ? pg->local_world_size() : pg->size();
  HSGD_CHECK(pg->size() % local_world_size == 0, "intra_node_subgroup: LOCAL_WORLD_SIZE ",
             local_world_size, " (the process group's local_world_size) must divide the size ",
             pg->size(), " of process group '", pg->name(), "'");
  if (local_world_size == pg->size()) return pg;
  return comm::new_subgroups(pg, local_world_size).first;
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
