#include "framework/distributed/averaged_replicas.h"

#include <algorithm>
#include <filesystem>
#include <string>

#include "comm/error.h"
#include "comm/format_ranks.h"
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

// The same, once averager is known to average over pg (before any rank communicates).
std::vector<Tensor> module_state(const nn::Module& model,
                                 const std::shared_ptr<comm::ProcessGroup>& pg,
                                 const ModelAverager& averager) {
  HSGD_CHECK(pg != nullptr && averager.process_group() == pg,
             "AveragedReplicas: the averager averages over group '",
             averager.process_group()->name(), "', not over '",
             pg != nullptr ? pg->name() : std::string("(null)"), "'");
  return module_state(model);
}

const nn::Module& non_null(const std::shared_ptr<nn::Module>& model) {
  HSGD_CHECK(model != nullptr, "AveragedReplicas: model is null");
  return *model;
}

// The barrier named after the place of construction: a guard built on some ranks only, or at
// different places, is reported here rather than matched with an unrelated later guard.
void meet_at(comm::ProcessGroup& pg, const std::source_location& where) {
  const std::string place =
      str_cat(std::filesystem::path(where.file_name()).filename().string(), ":", where.line());
  const std::string name = "AveragedReplicas at " + place;
  try {
    pg.named_barrier(name, comm::RunOn::kCaller)->wait(pg.work_timeout());
  } catch (const comm::CollectiveMismatch& e) {
    throw comm::CollectiveMismatch(
        str_cat("AveragedReplicas constructed at ", place, " on ",
                hsgd::detail::describe_rank_set(e.same_ranks()),
                " only; every rank must construct it at the same place: ", e.what()),
        e.same_ranks());
  }
}

}  // namespace

AveragedReplicas::AveragedReplicas(const std::shared_ptr<comm::ProcessGroup>& pg,
                                   const nn::Module& model, std::source_location where)
    : AveragedReplicas(pg, module_state(model), detail::describe_module(model), where) {}

AveragedReplicas::AveragedReplicas(const std::shared_ptr<comm::ProcessGroup>& pg,
                                   const std::shared_ptr<nn::Module>& model,
                                   std::source_location where)
    : AveragedReplicas(pg, non_null(model), where) {}

AveragedReplicas::AveragedReplicas(const std::shared_ptr<comm::ProcessGroup>& pg,
                                   const nn::Module& model, ModelAverager& averager,
                                   std::source_location where)
    : AveragedReplicas(
          pg, module_state(model, pg, averager), detail::describe_module(model), where,
          [&averager, &model] { return averager.average_replicas(model.parameters()); }) {}

AveragedReplicas::AveragedReplicas(const std::shared_ptr<comm::ProcessGroup>& pg,
                                   std::vector<Tensor> tensors, std::source_location where)
    : AveragedReplicas(pg, tensors, detail::describe_tensors(tensors, "tensor"), where) {}

AveragedReplicas::AveragedReplicas(const std::shared_ptr<comm::ProcessGroup>& pg,
                                   std::vector<Tensor> tensors,
                                   const std::vector<detail::TensorEntry>& entries,
                                   std::source_location where,
                                   const std::function<std::vector<Tensor>()>& through)
    : tensors_(std::move(tensors)) {
  HSGD_CHECK(pg != nullptr, "AveragedReplicas: process group is null");
  if (pg->size() == 1) return;
  meet_at(*pg, where);
  detail::check_same_tensors(*pg, "AveragedReplicas", entries, "the model");
  saved_.resize(static_cast<size_t>(flat_numel(tensors_)));
  flatten_into(tensors_, saved_);
  std::vector<Tensor> rest = tensors_;
  if (through) {
    const std::vector<Tensor> done = through();
    std::erase_if(rest, [&](const Tensor& t) {
      return std::any_of(done.begin(), done.end(),
                         [&](const Tensor& d) { return d.impl() == t.impl(); });
    });
  }
  // kAvg (sum, then divide by the group size): the same arithmetic per element as averaging
  // each tensor on its own.
  if (!rest.empty()) allreduce(*pg, rest, comm::ReduceOp::kAvg, "averaged replicas");
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
