#include "framework/tensor/tensor.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "comm/error.h"
#include "framework/autograd/engine.h"
#include "framework/autograd/node.h"
#include "framework/parallel/parallel.h"
#include "framework/tensor/strided_loop.h"
#include "framework/tensor/tensor_impl.h"

namespace hsgd {

// In-place updates (add_, mul_: SGD's step, gradient accumulation) of contiguous runs split
// across the pool in runs of at least this many floats.
constexpr int64_t kInPlaceGrain = 32768;

// ---- helpers ----

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

std::shared_ptr<TensorImpl> make_impl(Shape shape) {
  for (int64_t s : shape) {
    HSGD_CHECK(s >= 0, "Tensor: sizes must be non-negative, got shape ", shape_str(shape));
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->numel = shape_numel(shape);
  impl->storage = std::make_shared<Storage>(impl->numel);
  impl->strides = contiguous_strides(shape);
  impl->shape = std::move(shape);
  return impl;
}

std::shared_ptr<TensorImpl> make_view_impl(const Tensor& t, Shape shape,
                                           std::vector<int64_t> strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.impl()->storage;
  impl->offset = offset;
  impl->numel = shape_numel(shape);
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  return impl;
}

namespace {

const TensorImpl& checked(const std::shared_ptr<TensorImpl>& impl, const char* what) {
  HSGD_CHECK(impl != nullptr, "Tensor::", what, ": the tensor is undefined");
  return *impl;
}

}  // namespace

// ---- shape and data ----

Tensor::Tensor() = default;
Tensor::Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

const Shape& Tensor::shape() const { return checked(impl_, "shape").shape; }
int64_t Tensor::dim() const { return static_cast<int64_t>(shape().size()); }

int64_t Tensor::size(int64_t d) const {
  const int64_t n = dim();
  HSGD_CHECK(d >= -n && d < n, "Tensor::size: dim ", d, " out of range for shape ",
             shape_str(shape()));
  return impl_->shape[d < 0 ? d + n : d];
}

int64_t Tensor::numel() const { return checked(impl_, "numel").numel; }
const std::vector<int64_t>& Tensor::strides() const { return checked(impl_, "strides").strides; }

bool Tensor::is_contiguous() const {
  const TensorImpl& impl = checked(impl_, "is_contiguous");
  int64_t expected = 1;
  for (size_t i = impl.shape.size(); i-- > 0;) {
    if (impl.shape[i] == 1) continue;
    if (impl.strides[i] != expected) return false;
    expected *= impl.shape[i];
  }
  return true;
}

float* Tensor::data() {
  checked(impl_, "data");
  return impl_->data();
}

const float* Tensor::data() const {
  checked(impl_, "data");
  return impl_->data();
}

float Tensor::item() const {
  HSGD_CHECK(numel() == 1, "Tensor::item: needs a tensor with one element, got shape ",
             shape_str(shape()));
  return *data();
}

std::vector<float> Tensor::to_vector() const {
  std::vector<float> out(numel());
  if (out.empty()) return out;
  Tensor c = contiguous();
  std::memcpy(out.data(), c.data(), sizeof(float) * out.size());
  return out;
}

bool Tensor::shares_storage_with(const Tensor& other) const {
  return defined() && other.defined() && impl_->storage == other.impl_->storage;
}

// ---- autograd ----

Tensor Tensor::grad() const { return Tensor(checked(impl_, "grad").grad); }

void Tensor::set_grad(const Tensor& g) {
  checked(impl_, "set_grad");
  if (g.defined()) {
    HSGD_CHECK(g.shape() == impl_->shape, "Tensor::set_grad: gradient shape ", shape_str(g.shape()),
               " must equal the tensor shape ", shape_str(impl_->shape));
  }
  impl_->grad = g.impl_;
}

bool Tensor::requires_grad() const {
  const TensorImpl& impl = checked(impl_, "requires_grad");
  return impl.requires_grad || impl.grad_fn != nullptr;
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  checked(impl_, "set_requires_grad");
  HSGD_CHECK(impl_->grad_fn == nullptr,
             "Tensor::set_requires_grad: only leaves can be marked; "
             "this tensor is the output of ",
             impl_->grad_fn->name(), " (use detach() first)");
  impl_->requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const { return checked(impl_, "is_leaf").grad_fn == nullptr; }
std::shared_ptr<autograd::Node> Tensor::grad_fn() const {
  return checked(impl_, "grad_fn").grad_fn;
}

void Tensor::backward(bool retain_graph) {
  HSGD_CHECK(numel() == 1,
             "Tensor::backward: without grad_output the tensor must have one "
             "element, got shape ",
             shape_str(shape()), "; pass a grad_output of that shape");
  autograd::run_backward(*this, ones(shape()), retain_graph);
}

void Tensor::backward(const Tensor& grad_output, bool retain_graph) {
  autograd::run_backward(*this, grad_output, retain_graph);
}

int64_t Tensor::register_grad_ready_hook(GradReadyHook hook) {
  checked(impl_, "register_grad_ready_hook");
  HSGD_CHECK(impl_->grad_fn == nullptr,
             "Tensor::register_grad_ready_hook: only leaves take "
             "grad-ready hooks; this tensor is the output of ",
             impl_->grad_fn->name());
  HSGD_CHECK(hook != nullptr, "Tensor::register_grad_ready_hook: the hook is empty");
  const int64_t id = impl_->next_hook_id++;
  impl_->grad_ready_hooks.emplace_back(id, std::move(hook));
  return id;
}

void Tensor::remove_grad_ready_hook(int64_t id) {
  checked(impl_, "remove_grad_ready_hook");
  std::erase_if(impl_->grad_ready_hooks, [id](const auto& entry) { return entry.first == id; });
}

// ---- copies ----

Tensor Tensor::detach() const {
  checked(impl_, "detach");
  return Tensor(make_view_impl(*this, impl_->shape, impl_->strides, impl_->offset));
}

Tensor Tensor::clone() const {
  checked(impl_, "clone");
  Tensor out(make_impl(impl_->shape));
  {
    NoGradGuard no_grad;
    out.copy_(*this);
  }
  if (autograd::needs_grad({*this})) {
    autograd::record(
        out, "CloneBackward", {*this},
        [](const Tensor& g, const autograd::NeedsGrad&) { return std::vector<Tensor>{g}; });
  }
  return out;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

// ---- in-place ----

Tensor& Tensor::zero_() { return fill_(0.0f); }

Tensor& Tensor::fill_(float value) {
  checked(impl_, "fill_");
  detail::strided_loop<1>(impl_->shape, {impl_->data()}, {&impl_->strides},
                          [value](int64_t n, std::array<float*, 1> p, std::array<int64_t, 1> s) {
                            if (s[0] == 1) {
                              std::fill(p[0], p[0] + n, value);
                            } else {
                              for (int64_t i = 0; i < n; ++i) p[0][i * s[0]] = value;
                            }
                          });
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  checked(impl_, "copy_");
  HSGD_CHECK(src.defined(), "Tensor::copy_: the source is undefined");
  const std::vector<int64_t> src_strides =
      detail::broadcast_strides(src.shape(), src.strides(), impl_->shape);
  if (impl_->storage == src.impl_->storage && impl_->offset == src.impl_->offset &&
      impl_->strides == src_strides) {
    return *this;  // copying onto itself
  }
  detail::strided_loop<2>(impl_->shape, {impl_->data(), const_cast<float*>(src.data())},
                          {&impl_->strides, &src_strides},
                          [](int64_t n, std::array<float*, 2> p, std::array<int64_t, 2> s) {
                            if (s[0] == 1 && s[1] == 1) {
                              std::memcpy(p[0], p[1], sizeof(float) * n);
                            } else if (s[0] == 1 && s[1] == 0) {
                              std::fill(p[0], p[0] + n, *p[1]);
                            } else {
                              for (int64_t i = 0; i < n; ++i) p[0][i * s[0]] = p[1][i * s[1]];
                            }
                          });
  return *this;
}

Tensor& Tensor::add_(const Tensor& other, float alpha) {
  checked(impl_, "add_");
  HSGD_CHECK(other.defined(), "Tensor::add_: the other tensor is undefined");
  const std::vector<int64_t> other_strides =
      detail::broadcast_strides(other.shape(), other.strides(), impl_->shape);
  detail::strided_loop<2>(impl_->shape, {impl_->data(), const_cast<float*>(other.data())},
                          {&impl_->strides, &other_strides},
                          [alpha](int64_t n, std::array<float*, 2> p, std::array<int64_t, 2> s) {
                            float* __restrict d = p[0];
                            const float* __restrict o = p[1];
                            if (s[0] == 1 && s[1] == 1) {
                              parallel_for(0, n, kInPlaceGrain, [&](int64_t lo, int64_t hi) {
                                for (int64_t i = lo; i < hi; ++i) d[i] += alpha * o[i];
                              });
                            } else if (s[0] == 1 && s[1] == 0) {
                              const float v = alpha * *o;
                              for (int64_t i = 0; i < n; ++i) d[i] += v;
                            } else {
                              for (int64_t i = 0; i < n; ++i) d[i * s[0]] += alpha * o[i * s[1]];
                            }
                          });
  return *this;
}

Tensor& Tensor::mul_(float s) {
  checked(impl_, "mul_");
  detail::strided_loop<1>(impl_->shape, {impl_->data()}, {&impl_->strides},
                          [s](int64_t n, std::array<float*, 1> p, std::array<int64_t, 1> st) {
                            if (st[0] != 1) {
                              for (int64_t i = 0; i < n; ++i) p[0][i * st[0]] *= s;
                              return;
                            }
                            float* d = p[0];
                            parallel_for(0, n, kInPlaceGrain, [&](int64_t lo, int64_t hi) {
                              for (int64_t i = lo; i < hi; ++i) d[i] *= s;
                            });
                          });
  return *this;
}

// ---- debug ----

std::string Tensor::to_string() const {
  if (!defined()) return "Tensor(undefined)";
  constexpr size_t kMaxValues = 20;
  std::ostringstream out;
  out << "Tensor(shape=" << shape_str(shape());
  if (grad_fn()) out << ", grad_fn=" << grad_fn()->name();
  if (impl_->requires_grad) out << ", requires_grad";
  out << ", values=[";
  const std::vector<float> values = to_vector();
  for (size_t i = 0; i < values.size() && i < kMaxValues; ++i) {
    if (i > 0) out << ", ";
    out << values[i];
  }
  if (values.size() > kMaxValues) out << ", ... (" << values.size() << " total)";
  out << "])";
  return out.str();
}

}  // namespace hsgd
