#include "framework/distributed/model_averaging/utils.h"

#include <algorithm>
#include <span>

#include "comm/error.h"

namespace hsgd::distributed {
namespace {

int64_t total_numel(const std::vector<Tensor>& tensors) {
  int64_t n = 0;
  for (const Tensor& t : tensors) n += t.numel();
  return n;
}

// Copies each tensor into flat starting at offset, divided by divisor; returns the new offset.
// Dividing while packing saves a pass over the buffer (torch does cat, then div_).
int64_t pack(const std::vector<Tensor>& tensors, float divisor, float* flat, int64_t offset,
             const char* what) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    HSGD_CHECK(t.defined(), "average_parameters: ", what, " ", i, " is undefined");
    HSGD_CHECK(t.is_contiguous(), "average_parameters: ", what, " ", i,
               " must be contiguous (a parameter or buffer), got strides of a view");
    const float* src = t.data();
    float* dst = flat + offset;
    const int64_t n = t.numel();
    for (int64_t k = 0; k < n; ++k) dst[k] = src[k] / divisor;
    offset += n;
  }
  return offset;
}

int64_t unpack(const std::vector<Tensor>& tensors, const float* flat, int64_t offset) {
  for (const Tensor& t : tensors) {
    // const_cast-free: Tensor is a shallow handle, writing through a copy writes the storage.
    Tensor handle = t;
    std::copy_n(flat + offset, t.numel(), handle.data());
    offset += t.numel();
  }
  return offset;
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
                              comm::ProcessGroup& group) {
  const int64_t n = total_numel(params) + total_numel(buffers);
  if (n == 0) return 0;  // every rank filters the same way, so every rank skips together
  if (static_cast<int64_t>(flat_.size()) < n) flat_.resize(static_cast<size_t>(n));

  // flat_ is (n,): params then buffers, each pre-divided by the group size.
  const float divisor = static_cast<float>(group.size());
  int64_t offset = pack(params, divisor, flat_.data(), 0, "parameter");
  pack(buffers, divisor, flat_.data(), offset, "buffer");

  group.allreduce(std::span<float>(flat_.data(), static_cast<size_t>(n)), comm::ReduceOp::kSum)
      ->wait(group.timeout());

  offset = unpack(params, flat_.data(), 0);
  unpack(buffers, flat_.data(), offset);
  return n * static_cast<int64_t>(sizeof(float));
}

void average_parameters(const std::vector<Tensor>& params,
                        const std::shared_ptr<comm::ProcessGroup>& pg) {
  if (pg == nullptr) return;  // this rank is not a member of the group
  FlatAverager averager;
  averager.average(get_params_to_average(params), {}, *pg);
}

}  // namespace hsgd::distributed
