#include "framework/distributed/flat_buffer.h"

#include <algorithm>
#include <cstring>

#include "comm/error.h"
#include "framework/tensor/grad_mode.h"

namespace hsgd::distributed {
namespace {

void check_fits(const std::vector<Tensor>& tensors, size_t flat_size, const char* what) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    HSGD_CHECK(tensors[i].defined(), what, ": tensor ", i, " of ", tensors.size(), " is undefined");
  }
  const int64_t n = flat_numel(tensors);
  HSGD_CHECK(static_cast<int64_t>(flat_size) >= n, what, ": the flat buffer has ", flat_size,
             " elements; the ", tensors.size(), " tensors need ", n);
}

}  // namespace

int64_t flat_numel(const std::vector<Tensor>& tensors) {
  int64_t n = 0;
  for (const Tensor& t : tensors) n += t.defined() ? t.numel() : 0;
  return n;
}

int64_t flatten_into(const std::vector<Tensor>& tensors, std::span<float> flat, float divisor) {
  check_fits(tensors, flat.size(), "flatten_into");
  NoGradGuard no_grad;  // contiguous() of a strided parameter must not record history
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    const Tensor c = t.contiguous();  // t itself when contiguous: no copy
    const float* src = c.data();
    float* dst = flat.data() + offset;
    const int64_t n = c.numel();
    if (divisor == 1.0f) {
      std::copy_n(src, n, dst);
    } else {
      // Dividing while packing saves a pass over the buffer (torch does cat, then div_).
      for (int64_t k = 0; k < n; ++k) dst[k] = src[k] / divisor;
    }
    offset += n;
  }
  return offset;
}

int64_t unflatten_from(std::span<const float> flat, const std::vector<Tensor>& tensors) {
  check_fits(tensors, flat.size(), "unflatten_from");
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    const int64_t n = t.numel();
    Tensor handle = t;  // shallow: writing through it writes t's storage
    if (t.is_contiguous()) {
      std::copy_n(flat.data() + offset, n, handle.data());
    } else {
      handle.copy_(from_vector(std::vector<float>(flat.begin() + offset, flat.begin() + offset + n),
                               t.shape()));
    }
    offset += n;
  }
  return offset;
}

}  // namespace hsgd::distributed
