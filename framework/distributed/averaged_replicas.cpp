#include "framework/distributed/averaged_replicas.h"

#include "comm/error.h"
#include "comm/log.h"
#include "framework/distributed/flat_buffer.h"
#include "framework/distributed/tensor_collectives.h"

namespace hsgd::distributed {
namespace {

std::vector<Tensor> module_state(const nn::Module& model) {
  std::vector<Tensor> out;
  for (const auto& [name, p] : model.named_parameters()) out.push_back(p);
  for (const auto& [name, b] : model.named_buffers()) out.push_back(b);
  return out;
}

const nn::Module& non_null(const std::shared_ptr<nn::Module>& model) {
  HSGD_CHECK(model != nullptr, "AveragedReplicas: model is null");
  return *model;
}

}  // namespace

AveragedReplicas::AveragedReplicas(const std::shared_ptr<comm::ProcessGroup>& pg,
                                   const nn::Module& model)
    : AveragedReplicas(pg, module_state(model), detail::describe_module(model)) {}

AveragedReplicas::AveragedReplicas(const std::shared_ptr<comm::ProcessGroup>& pg,
                                   const std::shared_ptr<nn::Module>& model)
    : AveragedReplicas(pg, non_null(model)) {}

AveragedReplicas::AveragedReplicas(const std::shared_ptr<comm::ProcessGroup>& pg,
                                   std::vector<Tensor> tensors)
    : AveragedReplicas(pg, tensors, detail::describe_tensors(tensors, "tensor")) {}

AveragedReplicas::AveragedReplicas(const std::shared_ptr<comm::ProcessGroup>& pg,
                                   std::vector<Tensor> tensors,
                                   const std::vector<detail::TensorEntry>& entries)
    : tensors_(std::move(tensors)) {
  HSGD_CHECK(pg != nullptr, "AveragedReplicas: process group is null");
  if (pg->size() == 1) return;
  detail::check_same_tensors(*pg, "AveragedReplicas", entries, "the model");
  saved_.resize(static_cast<size_t>(flat_numel(tensors_)));
  flatten_into(tensors_, saved_);
  // kAvg (sum, then divide by the group size): the same arithmetic per element as averaging
  // each tensor on its own.
  allreduce(*pg, tensors_, comm::ReduceOp::kAvg, "averaged replicas");
}

AveragedReplicas::~AveragedReplicas() {
  if (keep_ || saved_.empty()) return;
  try {
    unflatten_from(saved_, tensors_);
  } catch (const std::exception& e) {  // only on a broken contract (tensors resized)
    comm::logger()->error("AveragedReplicas: could not restore the local values: {}", e.what());
  }
}

}  // namespace hsgd::distributed
