#include "framework/distributed/model_averaging/utils.h"

#include <span>

#include "comm/error.h"
#include "framework/distributed/flat_buffer.h"

namespace hsgd::distributed {
namespace {

// The averager's own input contract (utils.h): parameters and buffers, so defined and
// contiguous. Checked before packing, so that the message names the parameter or buffer.
void check_averageable(const std::vector<Tensor>& tensors, const char* what) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    HSGD_CHECK(t.defined(), "average_parameters: ", what, " ", i, " is undefined");
    HSGD_CHECK(t.is_contiguous(), "average_parameters: ", what, " ", i,
               " must be contiguous (a parameter or buffer), got strides of a view");
  }
}

}  // namespace

std::vector<Tensor> get_params_to_average(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  out.reserve(params.size());
  for (const Tensor& p : params) {
    if (p.defined() && p.grad().defined()) out.push_back(p);
  }
  return out;
}

std::vector<Tensor> get_params_to_average(const std::vector<ParamGroup>& groups) {
  std::vector<Tensor> out;
  for (const ParamGroup& g : groups) {
    for (const Tensor& p : g.params) {
      if (p.defined() && p.grad().defined()) out.push_back(p);
    }
  }
  return out;
}

int64_t FlatAverager::average(const std::vector<Tensor>& params, const std::vector<Tensor>& buffers,
                              comm::ProcessGroup& group, std::string_view label) {
  check_averageable(params, "parameter");
  check_averageable(buffers, "buffer");
  const int64_t n = flat_numel(params) + flat_numel(buffers);
  if (n == 0) return 0;  // every rank filters the same way, so every rank skips together
  if (static_cast<int64_t>(flat_.size()) < n) flat_.resize(static_cast<size_t>(n));

  // flat is (n,): params then buffers, each pre-divided by the group size.
  const std::span<float> flat(flat_.data(), static_cast<size_t>(n));
  const float divisor = static_cast<float>(group.size());
  const int64_t buffers_at = flatten_into(params, flat, divisor);
  flatten_into(buffers, flat.subspan(static_cast<size_t>(buffers_at)), divisor);

  group.allreduce(flat, comm::ReduceOp::kSum, label, comm::RunOn::kCaller)
      ->wait(group.work_timeout());

  unflatten_from(flat, params);
  unflatten_from(flat.subspan(static_cast<size_t>(buffers_at)), buffers);
  return n * static_cast<int64_t>(sizeof(float));
}

void average_parameters(const std::vector<Tensor>& params,
                        const std::shared_ptr<comm::ProcessGroup>& pg) {
  if (pg == nullptr) return;  // this rank is not a member of the group
  FlatAverager averager;
  averager.average(get_params_to_average(params), {}, *pg, "average_parameters");
}

}  // namespace hsgd::distributed
