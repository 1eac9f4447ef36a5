#include "framework/distributed/comm_hooks/default_hooks.h"

#include <string>

namespace hsgd::distributed {

std::shared_ptr<comm::Work> allreduce_hook(comm::ProcessGroup& pg, GradBucket& bucket) {
  std::span<float> data = bucket.data();
  // Pre-divide, as torch does, so that the sum cannot overflow where the average would not.
  const float divisor = static_cast<float>(pg.size());
  for (float& x : data) x /= divisor;
  return pg.allreduce(data, comm::ReduceOp::kSum, "DDP bucket " + std::to_string(bucket.index()));
}

}  // namespace hsgd::distributed
