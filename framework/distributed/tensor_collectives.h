#pragma once
// Collectives on Tensors, over a comm::ProcessGroup (which works on raw buffers and knows
// nothing of Tensor), like torch.distributed.all_reduce / broadcast with async_op=False.
//
// Contract:
// - Collective: every rank of pg calls the same function in the same order with tensors of the
//   same shapes (see comm/process_group/process_group.h; a mismatch is reported as a failed
//   collective).
// - Synchronous: each returns when its collective completed on this rank, so the tensors may
//   be used (and dropped) at once. Errors: hsgd::Timeout / hsgd::CommError from the collective,
//   hsgd::InvalidArgument for an undefined tensor.
// - The values are written into the tensors' own storage (every handle sharing it sees them),
//   without autograd history, as an optimizer step writes parameters. Any strides are accepted
//   (non-contiguous tensors go through a packed copy).
// - The vector forms coalesce: one collective over one flat buffer of all the tensors
//   (flat_buffer.h), not one per tensor.
// - label names the collective in failure reports ("evaluation average").
//
// Usage:
//   const float local_sum = loss.item();
//   hsgd::Tensor loss_sum = hsgd::full({1}, local_sum);
//   hsgd::distributed::allreduce(*world, loss_sum);                // sum over the ranks
//   hsgd::distributed::broadcast(*world, model->parameters(), 0);  // rank 0's weights everywhere

#include <string_view>
#include <vector>

#include "comm/process_group/process_group.h"
#include "framework/tensor/tensor.h"

namespace hsgd::distributed {

// In place: every rank gets op over the ranks' tensors (kAvg: the sum divided by pg.size()).
void allreduce(comm::ProcessGroup& pg, Tensor& tensor, comm::ReduceOp op = comm::ReduceOp::kSum,
               std::string_view label = {});
void allreduce(comm::ProcessGroup& pg, const std::vector<Tensor>& tensors,
               comm::ReduceOp op = comm::ReduceOp::kSum, std::string_view label = {});

// Copies root's tensors into every rank's (root is a rank of pg).
void broadcast(comm::ProcessGroup& pg, Tensor& tensor, int root, std::string_view label = {});
void broadcast(comm::ProcessGroup& pg, const std::vector<Tensor>& tensors, int root,
               std::string_view label = {});

}  // namespace hsgd::distributed
