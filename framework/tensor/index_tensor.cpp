#include "framework/tensor/index_tensor.h"

#include <algorithm>

#include "comm/error.h"
#include "framework/tensor/tensor_impl.h"

namespace hsgd {

namespace {

void check_shape(const Shape& shape, size_t count) {
  for (int64_t s : shape) {
    HSGD_CHECK(s >= 0, "IndexTensor: invalid size ", s, " in shape ", shape_str(shape));
  }
  HSGD_CHECK(shape_numel(shape) == static_cast<int64_t>(count), "IndexTensor: shape ",
             shape_str(shape), " holds ", shape_numel(shape), " values, got ", count);
}

}  // namespace

IndexTensor::IndexTensor(std::vector<int64_t> values) {
  const auto n = static_cast<int64_t>(values.size());
  *this = IndexTensor(std::move(values), Shape{n});
}

IndexTensor::IndexTensor(std::vector<int64_t> values, Shape shape) {
  check_shape(shape, values.size());
  numel_ = static_cast<int64_t>(values.size());
  shape_ = std::move(shape);
  values_ = std::make_shared<const std::vector<int64_t>>(std::move(values));
}

IndexTensor::IndexTensor(std::shared_ptr<const std::vector<int64_t>> values, int64_t offset,
                         Shape shape)
    : values_(std::move(values)),
      offset_(offset),
      shape_(std::move(shape)),
      numel_(shape_numel(shape_)) {}

int64_t IndexTensor::size(int64_t d) const {
  const int64_t n = dim();
  HSGD_CHECK(d >= -n && d < n, "IndexTensor::size: dim ", d, " out of range for shape ",
             shape_str(shape_), " (expected ", -n, " <= dim < ", n, ")");
  return shape_[static_cast<size_t>(d < 0 ? d + n : d)];
}

std::span<const int64_t> IndexTensor::values() const {
  if (!defined()) return {};
  return std::span<const int64_t>(values_->data() + offset_, static_cast<size_t>(numel_));
}

std::vector<int64_t> IndexTensor::to_vector() const {
  const std::span<const int64_t> v = values();
  return std::vector<int64_t>(v.begin(), v.end());
}

int64_t IndexTensor::operator[](int64_t i) const {
  HSGD_CHECK(i >= 0 && i < numel_, "IndexTensor: element ", i, " out of range for shape ",
             shape_str(shape_), " (", numel_, " elements)");
  return (*values_)[static_cast<size_t>(offset_ + i)];
}

IndexTensor IndexTensor::reshape(Shape shape) const {
  HSGD_CHECK(defined(), "IndexTensor::reshape: the tensor is undefined");
  return IndexTensor(values_, offset_,
                     infer_shape(std::move(shape), numel_, shape_, "IndexTensor::reshape"));
}

IndexTensor IndexTensor::narrow(int64_t dim_index, int64_t start, int64_t length) const {
  HSGD_CHECK(defined(), "IndexTensor::narrow: the tensor is undefined");
  const int64_t n = dim();
  HSGD_CHECK(dim_index >= -n && dim_index < n, "IndexTensor::narrow: dim ", dim_index,
             " out of range for shape ", shape_str(shape_));
  const auto d = static_cast<size_t>(dim_index < 0 ? dim_index + n : dim_index);
  HSGD_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d], "IndexTensor::narrow: [",
             start, ", ", start + length, ") is outside dim ", d, " of size ", shape_[d],
             " (shape ", shape_str(shape_), ")");
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < d; ++i) outer *= shape_[i];
  for (size_t i = d + 1; i < shape_.size(); ++i) inner *= shape_[i];
  Shape out_shape = shape_;
  out_shape[d] = length;
  if (outer == 1) return IndexTensor(values_, offset_ + start * inner, std::move(out_shape));
  // Not one contiguous range: a copy, which the values' immutability makes indistinguishable
  // from a view.
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(outer * length * inner));
  const int64_t* base = values_->data() + offset_;
  for (int64_t o = 0; o < outer; ++o) {
    const int64_t* row = base + (o * shape_[d] + start) * inner;
    out.insert(out.end(), row, row + length * inner);
  }
  return IndexTensor(std::move(out), std::move(out_shape));
}

Tensor IndexTensor::to_float() const {
  HSGD_CHECK(defined(), "IndexTensor::to_float: the tensor is undefined");
  Tensor out = empty(shape_);
  const std::span<const int64_t> v = values();
  std::transform(v.begin(), v.end(), out.data(), [](int64_t x) { return static_cast<float>(x); });
  return out;
}

}  // namespace hsgd
