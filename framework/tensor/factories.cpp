// Tensor factories: fresh contiguous leaves.

#include <algorithm>
#include <cstring>

#include "comm/error.h"
#include "framework/tensor/tensor.h"
#include "framework/tensor/tensor_impl.h"

namespace hsgd {

Tensor empty(Shape shape) { return Tensor(make_impl(std::move(shape))); }

Tensor full(Shape shape, float value) {
  Tensor t = empty(std::move(shape));
  std::fill(t.data(), t.data() + t.numel(), value);
  return t;
}

Tensor zeros(Shape shape) { return full(std::move(shape), 0.0f); }
Tensor ones(Shape shape) { return full(std::move(shape), 1.0f); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape()); }

Tensor normal(Shape shape, float mean, float std, Generator& gen) {
  HSGD_CHECK(std >= 0, "normal: std must be non-negative, got ", std);
  Tensor t = empty(std::move(shape));
  float* p = t.data();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = gen.normal(mean, std);
  return t;
}

Tensor randn(Shape shape, Generator& gen) { return normal(std::move(shape), 0.0f, 1.0f, gen); }

Tensor uniform(Shape shape, float lo, float hi, Generator& gen) {
  HSGD_CHECK(lo <= hi, "uniform: lo ", lo, " must not exceed hi ", hi);
  Tensor t = empty(std::move(shape));
  float* p = t.data();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = gen.uniform(lo, hi);
  return t;
}

Tensor rand(Shape shape, Generator& gen) { return uniform(std::move(shape), 0.0f, 1.0f, gen); }

Tensor from_vector(std::vector<float> values, Shape shape) {
  HSGD_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
             "from_vector: ", values.size(), " values do not fill shape ", shape_str(shape), " (",
             shape_numel(shape), " elements)");
  Tensor t = empty(std::move(shape));
  if (!values.empty()) std::memcpy(t.data(), values.data(), sizeof(float) * values.size());
  return t;
}

Tensor from_vector(std::vector<float> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  return from_vector(std::move(values), {n});
}

Tensor arange(int64_t n) {
  HSGD_CHECK(n >= 0, "arange: n must be non-negative, got ", n);
  Tensor t = empty({n});
  for (int64_t i = 0; i < n; ++i) t.data()[i] = static_cast<float>(i);
  return t;
}

}  // namespace hsgd
