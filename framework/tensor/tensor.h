#pragma once
// Tensor: hsgd's float32 N-d array with define-by-run autograd.
//
// COPYING A TENSOR IS SHALLOW. A Tensor is a cheap handle (one shared_ptr) to a tensor object
// that holds shape, strides, an offset into a shared Storage, and autograd state (requires_grad,
// grad, grad_fn, hooks). `Tensor b = a;` makes b the same tensor as a: writes through either are
// seen by both, and b.set_requires_grad(true) also affects a. Views (reshape of a contiguous
// tensor, view, flatten, transpose, t, narrow, permute, detach) are different tensor objects over
// the same Storage: their data is shared, their autograd state is not. clone() is the deep copy.
//
// Autograd: a leaf with requires_grad() == true gets gradients; an op whose input requires grad
// (while grad mode is on, see grad_mode.h) records a grad_fn node on its output, and
// loss.backward() accumulates d loss / d leaf into leaf.grad() (adding to what is already there,
// as in PyTorch; clearing is the optimizer's zero_grad). In-place methods (zero_, fill_, copy_,
// add_, mul_) never record history: they are meant for initialisation and optimizer updates.
//
// A Tensor is not synchronised: one thread at a time may use a given tensor object.
//
// Usage:
//   hsgd::Generator gen(0);
//   hsgd::Tensor w = hsgd::randn({3, 2}, gen).set_requires_grad(true);
//   hsgd::Tensor x = hsgd::ones({4, 3});
//   hsgd::Tensor loss = hsgd::sum(hsgd::matmul(x, w));
//   loss.backward();                  // w.grad() is (3,2), every entry 4
//
// Errors: wrong shapes, indices or arguments throw hsgd::InvalidArgument naming the value.

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "framework/tensor/generator.h"
#include "framework/tensor/grad_mode.h"

namespace hsgd {

using Shape = std::vector<int64_t>;

struct TensorImpl;  // framework/tensor/tensor_impl.h (internal)
namespace autograd {
class Node;
}

// "[2, 3]" for messages.
std::string shape_str(const Shape& shape);
// Product of the sizes (1 for a 0-d shape).
int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  // An undefined tensor (defined() == false), e.g. the grad() of a leaf before any backward.
  Tensor();
  explicit Tensor(std::shared_ptr<TensorImpl> impl);

  // ---- shape and data ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t dim() const;
  // Size of dimension d; negative d counts from the end.
  int64_t size(int64_t d) const;
  int64_t numel() const;
  const std::vector<int64_t>& strides() const;
  bool is_contiguous() const;
  // Pointer to the first element (storage offset applied). The memory is laid out by strides();
  // callers needing flat row-major access call contiguous() first.
  float* data();
  const float* data() const;
  // The single value of a one-element tensor; otherwise InvalidArgument.
  float item() const;
  // Values in row-major order (works for any strides).
  std::vector<float> to_vector() const;
  // True when both tensors view the same Storage (whatever their offsets).
  bool shares_storage_with(const Tensor& other) const;

  // ---- autograd ----
  // Undefined until a backward reaches this leaf (or set_grad is called).
  Tensor grad() const;
  // Replaces the gradient; g must be undefined or have this tensor's shape.
  void set_grad(const Tensor& g);
  // True for a leaf marked with set_requires_grad(true) and for every output recorded by autograd.
  bool requires_grad() const;
  // Marks a leaf; non-leaves (outputs of recorded ops) throw InvalidArgument. Returns *this.
  Tensor& set_requires_grad(bool requires_grad);
  // True when no op recorded this tensor (it has no grad_fn).
  bool is_leaf() const;
  // The node that computes this tensor's gradient inputs; null for leaves.
  std::shared_ptr<autograd::Node> grad_fn() const;
  // Computes d this / d leaf for every leaf that requires grad and adds it to leaf.grad().
  // The no-argument form needs a one-element tensor (InvalidArgument otherwise); grad_output must
  // have this tensor's shape. The graph is released afterwards: a second backward through the
  // same nodes throws hsgd::Error, unless retain_graph kept it (torch's retain_graph=True).
  void backward(bool retain_graph = false);
  void backward(const Tensor& grad_output, bool retain_graph = false);

  // Per-leaf "gradient ready" hook: fires during backward() once this leaf's gradient for the pass
  // is final (all contributions of the pass accumulated into grad()). It fires at most once per
  // backward pass, on the thread that runs backward(). DDP uses it to start bucket communication
  // while backward continues. Only leaves take hooks (InvalidArgument otherwise). A leaf that the
  // graph of the root does not reach (unused by the loss) gets no call in that pass; a reached
  // leaf always gets exactly one, even if every path to it produced no gradient. Hooks run with
  // grad mode off, in registration order. The id is used to remove the hook; removing an unknown
  // id is a no-op.
  using GradReadyHook = std::function<void(Tensor& leaf)>;
  int64_t register_grad_ready_hook(GradReadyHook hook);
  void remove_grad_ready_hook(int64_t id);

  // ---- copies and views ----
  // A leaf over the same storage, without autograd history.
  Tensor detach() const;
  // A deep copy (contiguous), recorded by autograd (gradient flows back unchanged).
  Tensor clone() const;
  // *this if already contiguous, otherwise a recorded contiguous copy.
  Tensor contiguous() const;

  // ---- in-place, never recorded ----
  Tensor& zero_();
  Tensor& fill_(float value);
  // Copies src (broadcast to this shape) into this tensor's memory.
  Tensor& copy_(const Tensor& src);
  // this += alpha * other (other broadcast to this shape).
  Tensor& add_(const Tensor& other, float alpha = 1);
  Tensor& mul_(float s);

  // ---- shape views, recorded by autograd ----
  // One size may be -1 (inferred). A view when contiguous, otherwise a copy (like torch).
  Tensor reshape(Shape shape) const;
  // Like reshape but requires a contiguous tensor (never copies).
  Tensor view(Shape shape) const;
  // Merges dims start..end (inclusive, negative counts from the end) into one.
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  // transpose(0, 1) of a 2-D tensor.
  Tensor t() const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  // Elements start .. start+length-1 of dimension d (a view).
  Tensor narrow(int64_t d, int64_t start, int64_t length) const;
  // Inserts / removes a size-1 dimension at d.
  Tensor unsqueeze(int64_t d) const;
  Tensor squeeze(int64_t d) const;

  // Debug print: shape, grad_fn name and the first values. operator<< (below) prints like torch.
  std::string to_string() const;

  // For kernels and the autograd engine (internal).
  const std::shared_ptr<TensorImpl>& impl() const { return impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// ---- factories (leaves, requires_grad false) ----
Tensor empty(Shape shape);  // uninitialised values
Tensor zeros(Shape shape);
Tensor ones(Shape shape);
Tensor full(Shape shape, float value);
Tensor randn(Shape shape, Generator& gen);  // N(0, 1)
Tensor rand(Shape shape, Generator& gen);   // U[0, 1)
Tensor uniform(Shape shape, float lo, float hi, Generator& gen);
Tensor normal(Shape shape, float mean, float std, Generator& gen);
// values.size() must equal the product of shape.
Tensor from_vector(std::vector<float> values, Shape shape);
// A 1-D tensor of values (shape {values.size()}).
Tensor from_vector(std::vector<float> values);
Tensor arange(int64_t n);  // 0, 1, ..., n-1
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);

// Prints t as PyTorch does: nested brackets, aligned columns, "1." when every value is an
// integer and 4 decimals otherwise, summarised with " ..." beyond 1000 elements (the first and
// last 3 of each dimension), and the grad_fn or requires_grad:
//   std::cout << hsgd::ones({2, 3});   // tensor([[1., 1., 1.],
//                                      //         [1., 1., 1.]])
std::ostream& operator<<(std::ostream& out, const Tensor& t);

}  // namespace hsgd
