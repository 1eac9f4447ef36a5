#pragma once
// TensorImpl: the object a Tensor handle points to. Internal to framework/tensor and
// framework/autograd; applications use Tensor.

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "framework/tensor/storage.h"
#include "framework/tensor/tensor.h"

namespace hsgd {

struct TensorImpl {
  // ---- data ----
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  std::vector<int64_t> strides;  // in elements
  int64_t numel = 0;

  // ---- autograd ----
  bool requires_grad = false;                      // meaningful for leaves only
  std::shared_ptr<TensorImpl> grad;                // leaf gradient, null until set
  std::shared_ptr<autograd::Node> grad_fn;         // null for leaves
  std::weak_ptr<autograd::Node> grad_accumulator;  // a leaf's AccumulateGrad, while a graph uses it
  std::vector<std::pair<int64_t, Tensor::GradReadyHook>> grad_ready_hooks;
  int64_t next_hook_id = 0;

  float* data() { return storage->data() + offset; }
};

// Row-major strides of a shape.
std::vector<int64_t> contiguous_strides(const Shape& shape);
// A new contiguous, uninitialised impl.
std::shared_ptr<TensorImpl> make_impl(Shape shape);
// A view impl over t's storage with the given geometry (no autograd state).
std::shared_ptr<TensorImpl> make_view_impl(const Tensor& t, Shape shape,
                                           std::vector<int64_t> strides, int64_t offset);

// Resolves one -1 entry of shape and checks that it holds numel elements (InvalidArgument naming
// op, the shape and `from`, the shape being reshaped, otherwise).
Shape infer_shape(Shape shape, int64_t numel, const Shape& from, const char* op);

}  // namespace hsgd
