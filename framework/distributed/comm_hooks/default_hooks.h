#pragma once
// Built-in DDP communication hooks (torch.distributed.algorithms.ddp_comm_hooks.default_hooks).
//
// Usage:
//   ddp.register_comm_hook(pg, hsgd::distributed::allreduce_hook);   // the default

#include <memory>

#include "comm/process_group/process_group.h"
#include "framework/distributed/grad_bucket.h"

namespace hsgd::distributed {

// Divides bucket.buffer() by pg.size() and launches a sum-allreduce of it over pg: when the
// returned Work completes, the buffer holds the average over pg. DDP's default hook.
std::shared_ptr<comm::Work> allreduce_hook(comm::ProcessGroup& pg, GradBucket& bucket);

}  // namespace hsgd::distributed
