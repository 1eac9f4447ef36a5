#pragma once
// AveragedReplicas: for the lifetime of the guard, the model's parameters AND buffers hold the
// average of every rank's replica; the destructor puts each rank's own values back. The way to
// evaluate what local SGD / hierarchical averaging trained (the replicas drift apart between
// averagings) without changing the training.
//
// Unlike distributed::average_parameters (torch semantics: only parameters with a gradient),
// this averages every tensor of the model: parameters with or without a gradient (before the
// first backward too) and buffers (BatchNorm running statistics).
//
// Contract:
// - Construction is collective over pg (every rank constructs one at the same point): a barrier
//   named after the place in the code where it is constructed ("AveragedReplicas at
//   train.cpp:42", from std::source_location), a check that every rank holds the same tensors
//   (replica_check.h, one small allgather), then one allreduce (kAvg) of all of them. A guard
//   built on some ranks only (inside `if (rank == 0)`) thus fails at its construction within
//   seconds (the group's mismatch check, comm/process_group/process_group.h) with
//   comm::CollectiveMismatch naming that place, instead of meeting the other ranks' next guard
//   built elsewhere. So every rank must construct it at the same line (not on two branches of
//   an if). The destructor is local (no communication) and never
//   throws.
// - Given a ModelAverager over pg, what it averages (its parameters with a gradient and option
//   buffers) goes through ModelAverager::average_replicas: with a compressed top level, each
//   rank sends its difference from the level's anchor in the level's format between nodes, and
//   the average is the mean up to the rounding of one averaging of that level (the same bits on
//   every rank). The rest of the model, and everything when average_replicas takes nothing (a
//   float32 top level, no anchor yet), is averaged in float32 as without it.
// - keep(): the average stays when the guard ends (e.g. after the last epoch, so that every
//   rank saves the same model).
// - A group of one changes nothing and communicates nothing.
// - The tensors must not be replaced (their storage is written) while the guard lives; training
//   inside the guard would be undone by the destructor.
//
// Usage (evaluate the average on rank 0, keep training the local replicas):
//   double accuracy = 0;
//   {
//     hsgd::distributed::AveragedReplicas average(world, model);
//     if (world->rank() == 0) accuracy = hsgd::nn::accuracy(model->forward(x), y);
//   }  // every rank has its own replica back

#include <functional>
#include <memory>
#include <source_location>
#include <vector>

#include "comm/process_group/process_group.h"
#include "framework/distributed/model_averaging/averagers.h"
#include "framework/distributed/replica_check.h"
#include "framework/nn/module.h"
#include "framework/tensor/tensor.h"

namespace hsgd::distributed {

class AveragedReplicas {
 public:
  // The model's named_parameters() then named_buffers().
  // where: the caller's place, which names the barrier (leave the default).
  AveragedReplicas(const std::shared_ptr<comm::ProcessGroup>& pg, const nn::Module& model,
                   std::source_location where = std::source_location::current());
  AveragedReplicas(const std::shared_ptr<comm::ProcessGroup>& pg,
                   const std::shared_ptr<nn::Module>& model,
                   std::source_location where = std::source_location::current());
  // The model's tensors, through averager where it averages them (see the contract above).
  // averager must average over pg (its process_group()).
  AveragedReplicas(const std::shared_ptr<comm::ProcessGroup>& pg, const nn::Module& model,
                   ModelAverager& averager,
                   std::source_location where = std::source_location::current());
  // Any tensors, e.g. a model's state as a flat list; the same shapes in the same order on every
  // rank.
  AveragedReplicas(const std::shared_ptr<comm::ProcessGroup>& pg, std::vector<Tensor> tensors,
                   std::source_location where = std::source_location::current());
  ~AveragedReplicas();
  AveragedReplicas(const AveragedReplicas&) = delete;
  AveragedReplicas& operator=(const AveragedReplicas&) = delete;

  // Keep the averaged values when the guard ends instead of restoring the local ones.
  void keep() { keep_ = true; }

 private:
  // entries describe tensors for the check across ranks. through (when set) averages some of
  // the tensors and returns them; the others are averaged in float32.
  AveragedReplicas(const std::shared_ptr<comm::ProcessGroup>& pg, std::vector<Tensor> tensors,
                   const std::vector<detail::TensorEntry>& entries, std::source_location where,
                   const std::function<std::vector<Tensor>()>& through = {});

  const std::vector<Tensor> tensors_;
  std::vector<float> saved_;  // (sum of numel,) the local values, packed in order
  bool keep_ = false;
};

}  // namespace hsgd::distributed
