// masked_fill, where, tril and triu, forward and backward. A mask is a float tensor of exact 0s
// and 1s (ops.h says why); every op here validates it before using it.

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/tensor/ops.h"
#include "framework/tensor/strided_loop.h"
#include "framework/tensor/tensor_impl.h"

namespace hsgd {

using autograd::NeedsGrad;

namespace {

// InvalidArgument naming the first element of mask that is neither 0 nor 1.
void check_mask(const Tensor& mask, const char* op, const char* what) {
  HSGD_CHECK(mask.defined(), op, ": the ", what, " is undefined");
  const Tensor c = mask.detach().contiguous();
  const float* p = c.data();
  for (int64_t i = 0; i < c.numel(); ++i) {
    HSGD_CHECK(p[i] == 0.0f || p[i] == 1.0f, op, ": ", what, " element ", i, " (row-major, shape ",
               shape_str(mask.shape()), ") is ", p[i],
               ", expected 0 or 1 (a float 0/1 mask; hsgd has no bool dtype)");
  }
}

// The broadcast shape of the operands of `op`, or InvalidArgument naming all of them.
Shape broadcast_operands(const char* op, std::initializer_list<std::pair<const char*, Shape>> in) {
  Shape shape;
  bool ok = true;
  for (const auto& [name, s] : in) {
    try {
      shape = broadcast_shapes(shape, s);
    } catch (const InvalidArgument&) {
      ok = false;
    }
  }
  if (!ok) {
    std::string shapes;
    for (const auto& [name, s] : in)
      shapes += str_cat(shapes.empty() ? "" : ", ", name, " ", shape_str(s));
    HSGD_CHECK(ok, op, ": shapes ", shapes, " do not broadcast together");
  }
  return shape;
}

// out = condition ? a : b elementwise over the broadcast of the three shapes, for a condition
// already checked to hold only 0s and 1s and shapes that broadcast. Not recorded.
Tensor select_kernel(const Tensor& condition, const Tensor& a, const Tensor& b) {
  const Shape shape = broadcast_shapes(condition.shape(), broadcast_shapes(a.shape(), b.shape()));
  Tensor out = empty(shape);
  const std::vector<int64_t> sc =
      detail::broadcast_strides(condition.shape(), condition.strides(), shape);
  const std::vector<int64_t> sa = detail::broadcast_strides(a.shape(), a.strides(), shape);
  const std::vector<int64_t> sb = detail::broadcast_strides(b.shape(), b.strides(), shape);
  detail::strided_loop<4>(shape,
                          {out.data(), const_cast<float*>(condition.data()),
                           const_cast<float*>(a.data()), const_cast<float*>(b.data())},
                          {&out.strides(), &sc, &sa, &sb},
                          [](int64_t n, std::array<float*, 4> p, std::array<int64_t, 4> s) {
                            for (int64_t i = 0; i < n; ++i) {
                              p[0][i * s[0]] =
                                  p[1][i * s[1]] != 0.0f ? p[2][i * s[2]] : p[3][i * s[3]];
                            }
                          });
  return out;
}

// A 0-d tensor holding v, the scalar operand of select_kernel.
Tensor scalar(float v) { return full({}, v); }

// The gradient reaching `a` of select(condition, a, b) (where_a) or `b` (!where_a).
Tensor select_backward(const Tensor& g, const Tensor& condition, bool where_a, const Shape& shape) {
  const Tensor picked = where_a ? select_kernel(condition, g, scalar(0.0f))
                                : select_kernel(condition, scalar(0.0f), g);
  return sum_to(picked, shape);
}

// Keeps element (i, j) of each (R, C) matrix of x when lower ? j - i <= k : j - i >= k.
Tensor triangle(const Tensor& x, int64_t k, bool lower, const char* op) {
  HSGD_CHECK(x.defined(), op, ": the input is undefined");
  HSGD_CHECK(x.dim() >= 2, op, ": needs a tensor of at least 2 dims (..., R, C), got shape ",
             shape_str(x.shape()));
  const Tensor c = x.detach().contiguous();
  Tensor out = empty(x.shape());
  const int64_t rows = x.size(-2), cols = x.size(-1);
  const int64_t matrices = rows * cols == 0 ? 0 : x.numel() / (rows * cols);
  const float* px = c.data();
  float* po = out.data();
  for (int64_t m = 0; m < matrices; ++m) {
    for (int64_t i = 0; i < rows; ++i) {
      // Row i keeps columns [lo, hi): j <= i + k (tril) or j >= i + k (triu).
      const int64_t lo = lower ? 0 : std::clamp<int64_t>(i + k, 0, cols);
      const int64_t hi = lower ? std::clamp<int64_t>(i + k + 1, 0, cols) : cols;
      const float* src = px + (m * rows + i) * cols;
      float* dst = po + (m * rows + i) * cols;
      std::fill(dst, dst + lo, 0.0f);
      std::copy(src + lo, src + hi, dst + lo);
      std::fill(dst + hi, dst + cols, 0.0f);
    }
  }
  if (autograd::needs_grad({x})) {
    autograd::record(out, lower ? "TrilBackward" : "TriuBackward", {x},
                     [k, lower, op](const Tensor& g, const NeedsGrad&) {
                       return std::vector<Tensor>{triangle(g, k, lower, op)};
                     });
  }
  return out;
}

}  // namespace

Tensor masked_fill(const Tensor& x, const Tensor& mask, float value) {
  HSGD_CHECK(x.defined(), "masked_fill: the input is undefined");
  check_mask(mask, "masked_fill", "mask");
  broadcast_operands("masked_fill", {{"input", x.shape()}, {"mask", mask.shape()}});
  Tensor out = select_kernel(mask, scalar(value), x);
  if (autograd::needs_grad({x})) {
    autograd::record(out, "MaskedFillBackward", {x},
                     [mask = mask.detach(), shape = x.shape()](const Tensor& g, const NeedsGrad&) {
                       return std::vector<Tensor>{select_backward(g, mask, false, shape)};
                     });
  }
  return out;
}

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  HSGD_CHECK(a.defined() && b.defined(), "where: an input is undefined");
  check_mask(condition, "where", "condition");
  broadcast_operands("where",
                     {{"condition", condition.shape()}, {"a", a.shape()}, {"b", b.shape()}});
  Tensor out = select_kernel(condition, a, b);
  if (autograd::needs_grad({a, b})) {
    autograd::record(out, "WhereBackward", {a, b},
                     [condition = condition.detach(), sa = a.shape(), sb = b.shape()](
                         const Tensor& g, const NeedsGrad& needs) {
                       std::vector<Tensor> grads(2);
                       if (needs[0]) grads[0] = select_backward(g, condition, true, sa);
                       if (needs[1]) grads[1] = select_backward(g, condition, false, sb);
                       return grads;
                     });
  }
  return out;
}

Tensor tril(const Tensor& x, int64_t k) { return triangle(x, k, true, "tril"); }
Tensor triu(const Tensor& x, int64_t k) { return triangle(x, k, false, "triu"); }

}  // namespace hsgd
