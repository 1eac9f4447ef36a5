#pragma once
// IndexTensor: a tensor of int64 indices (token ids, class targets), torch's LongTensor for what
// hsgd uses it for: handing ids to embedding and targets to cross_entropy without passing them
// through float32 (which is exact only up to 2^24).
//
// Copying an IndexTensor is shallow, as for Tensor: the copies share the values. The values are
// immutable after construction, so sharing is never observable; reshape() and narrow() are
// views that share them too. An IndexTensor is always contiguous (row-major). It takes no part
// in autograd (integer tensors have no gradient in torch either).
//
// Usage:
//   IndexTensor ids({3, 14, 15, 92, 65, 35}, {2, 3});      // (2,3)
//   Generator gen(0);
//   Tensor x = embedding(randn({100, 8}, gen), ids);        // (2,3,8)
//   Tensor logits = randn({2, 3, 100}, gen);                // a language model's (B,T,V)
//   IndexTensor next({14, 15, 92, 65, 35, 89}, {2, 3});     // each position's next token
//   Tensor loss = cross_entropy(logits.reshape({-1, 100}), next.reshape({-1}));
//   IndexTensor first = ids.narrow(0, 0, 1);               // (1,3): {3, 14, 15}
//
// Errors (InvalidArgument naming the value): a shape whose element count differs from the number
// of values, or with a negative size; reshape to another element count; an index or range
// outside the shape.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "framework/tensor/tensor.h"

namespace hsgd {

class IndexTensor {
 public:
  // An undefined index tensor (defined() is false), as Tensor's default.
  IndexTensor() = default;
  // A 1-D tensor of the values.
  explicit IndexTensor(std::vector<int64_t> values);
  // The values in row-major order of shape.
  IndexTensor(std::vector<int64_t> values, Shape shape);

  bool defined() const { return values_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  // Size of dimension d; negative d counts from the end.
  int64_t size(int64_t d) const;
  int64_t numel() const { return numel_; }

  // The values in row-major order.
  std::span<const int64_t> values() const;
  std::vector<int64_t> to_vector() const;
  // Element i of the row-major order, i in [0, numel()).
  int64_t operator[](int64_t i) const;

  // The same values in another shape; one size may be -1 (inferred), as Tensor::reshape.
  IndexTensor reshape(Shape shape) const;
  // Elements [start, start + length) along dim, as Tensor::narrow. When every dimension before
  // dim has size 1 (always for dim 0) the result shares the values; otherwise it is a copy, which
  // the values' immutability makes indistinguishable from a view.
  IndexTensor narrow(int64_t dim, int64_t start, int64_t length) const;

  // The values as float32 (torch's .float()); exact up to 2^24.
  Tensor to_float() const;

 private:
  IndexTensor(std::shared_ptr<const std::vector<int64_t>> values, int64_t offset, Shape shape);

  std::shared_ptr<const std::vector<int64_t>> values_;
  int64_t offset_ = 0;
  Shape shape_;
  int64_t numel_ = 0;
};

}  // namespace hsgd
