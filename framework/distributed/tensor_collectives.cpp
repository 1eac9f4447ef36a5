#include "framework/distributed/tensor_collectives.h"

#include <span>

#include "comm/error.h"
#include "framework/distributed/flat_buffer.h"

namespace hsgd::distributed {
namespace {

// Runs collective on the tensor's memory when it is contiguous, else on a packed copy that is
// written back afterwards.
template <typename Collective>
void on_one(Tensor& tensor, const char* what, Collective collective) {
  HSGD_CHECK(tensor.defined(), what, ": the tensor is undefined");
  // Even an empty tensor takes part, so that the sequence of collectives stays the same.
  if (tensor.is_contiguous()) {
    collective(std::span<float>(tensor.data(), static_cast<size_t>(tensor.numel())));
    return;
  }
  const std::vector<Tensor> one{tensor};
  std::vector<float> flat(static_cast<size_t>(tensor.numel()));  // (numel,) row-major copy
  flatten_into(one, flat);
  collective(std::span<float>(flat));
  unflatten_from(flat, one);
}

// Runs collective on one flat buffer holding every tensor, then copies it back.
template <typename Collective>
void on_many(const std::vector<Tensor>& tensors, const char* what, Collective collective) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    HSGD_CHECK(tensors[i].defined(), what, ": tensor ", i, " of ", tensors.size(), " is undefined");
  }
  std::vector<float> flat(static_cast<size_t>(flat_numel(tensors)));  // (sum of numel,)
  flatten_into(tensors, flat);
  collective(std::span<float>(flat));
  unflatten_from(flat, tensors);
}

}  // namespace

void allreduce(comm::ProcessGroup& pg, Tensor& tensor, comm::ReduceOp op, std::string_view label) {
  on_one(tensor, "distributed::allreduce", [&](std::span<float> data) {
    pg.allreduce(data, op, label, comm::RunOn::kCaller)->wait(pg.work_timeout());
  });
}

void allreduce(comm::ProcessGroup& pg, const std::vector<Tensor>& tensors, comm::ReduceOp op,
               std::string_view label) {
  on_many(tensors, "distributed::allreduce", [&](std::span<float> data) {
    pg.allreduce(data, op, label, comm::RunOn::kCaller)->wait(pg.work_timeout());
  });
}

void broadcast(comm::ProcessGroup& pg, Tensor& tensor, int root, std::string_view label) {
  on_one(tensor, "distributed::broadcast", [&](std::span<float> data) {
    pg.broadcast(data, root, label, comm::RunOn::kCaller)->wait(pg.work_timeout());
  });
}

void broadcast(comm::ProcessGroup& pg, const std::vector<Tensor>& tensors, int root,
               std::string_view label) {
  on_many(tensors, "distributed::broadcast", [&](std::span<float> data) {
    pg.broadcast(data, root, label, comm::RunOn::kCaller)->wait(pg.work_timeout());
  });
}

}  // namespace hsgd::distributed
