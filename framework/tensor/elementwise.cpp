// Elementwise ops: broadcasting binary arithmetic and unary functions, forward and backward.

#include <algorithm>
#include <cmath>

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/parallel/parallel.h"
#include "framework/tensor/ops.h"
#include "framework/tensor/strided_loop.h"
#include "framework/tensor/tensor_impl.h"

namespace hsgd {

using autograd::NeedsGrad;

// ---- broadcasting ----

namespace detail {

std::vector<int64_t> broadcast_strides(const Shape& from_shape, const std::vector<int64_t>& from,
                                       const Shape& to) {
  HSGD_CHECK(from_shape.size() <= to.size(), "broadcast: shape ", shape_str(from_shape),
             " cannot be broadcast to ", shape_str(to));
  std::vector<int64_t> strides(to.size(), 0);
  const size_t lead = to.size() - from_shape.size();
  for (size_t i = 0; i < from_shape.size(); ++i) {
    const int64_t s = from_shape[i];
    HSGD_CHECK(s == to[lead + i] || s == 1, "broadcast: shape ", shape_str(from_shape),
               " cannot be broadcast to ", shape_str(to), " (size ", s, " vs ", to[lead + i],
               " at dim ", lead + i, ")");
    strides[lead + i] = s == 1 ? 0 : from[i];
  }
  return strides;
}

}  // namespace detail

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t sa = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t sb = i < n - b.size() ? 1 : b[i - (n - b.size())];
    HSGD_CHECK(sa == sb || sa == 1 || sb == 1, "shapes ", shape_str(a), " and ", shape_str(b),
               " do not broadcast (size ", sa, " vs ", sb, " at dim ", i, ")");
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const Shape& gs = g.shape();
  HSGD_CHECK(shape.size() <= gs.size(), "sum_to: cannot reduce shape ", shape_str(gs), " to ",
             shape_str(shape));
  const size_t lead = gs.size() - shape.size();
  Tensor r = g;
  // Dims present in `shape` with size 1 but expanded in g: keep them.
  for (size_t i = gs.size(); i-- > lead;) {
    if (shape[i - lead] == 1 && gs[i] != 1) r = sum(r, static_cast<int64_t>(i), true);
  }
  // Leading dims that `shape` lacks: drop them.
  for (size_t i = 0; i < lead; ++i) r = sum(r, 0, false);
  HSGD_CHECK(r.shape() == shape, "sum_to: cannot reduce shape ", shape_str(gs), " to ",
             shape_str(shape));
  return r;
}

Tensor expand_copy(const Tensor& t, const Shape& shape) {
  Tensor out = empty(shape);
  out.copy_(t);
  return out;
}

// ---- binary kernels ----

namespace {

// Contiguous elementwise loops split across the pool in runs of at least this many floats
// (smaller runs cost more to hand out than to compute). Each output is computed alone, so
// results do not depend on the thread count.
constexpr int64_t kElementwiseGrain = 32768;

// out = op(a, b) with broadcasting; out is a fresh contiguous tensor.
template <typename Op>
Tensor binary_kernel(const Tensor& a, const Tensor& b, Op op) {
  HSGD_CHECK(a.defined() && b.defined(), "elementwise op: an input is undefined");
  const Shape shape = a.shape() == b.shape() ? a.shape() : broadcast_shapes(a.shape(), b.shape());
  Tensor out = empty(shape);
  float* o = out.data();
  if (a.shape() == b.shape() && a.is_contiguous() && b.is_contiguous()) {
    const float* __restrict pa = a.data();
    const float* __restrict pb = b.data();
    parallel_for(0, out.numel(), kElementwiseGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) o[i] = op(pa[i], pb[i]);
    });
    return out;
  }
  const std::vector<int64_t> sa = detail::broadcast_strides(a.shape(), a.strides(), shape);
  const std::vector<int64_t> sb = detail::broadcast_strides(b.shape(), b.strides(), shape);
  detail::strided_loop<3>(shape, {o, const_cast<float*>(a.data()), const_cast<float*>(b.data())},
                          {&out.strides(), &sa, &sb},
                          [op](int64_t n, std::array<float*, 3> p, std::array<int64_t, 3> s) {
                            float* __restrict po = p[0];
                            const float* __restrict pa = p[1];
                            const float* __restrict pb = p[2];
                            if (s[1] == 1 && s[2] == 1) {
                              for (int64_t i = 0; i < n; ++i) po[i] = op(pa[i], pb[i]);
                            } else if (s[1] == 1 && s[2] == 0) {
                              const float vb = *pb;
                              for (int64_t i = 0; i < n; ++i) po[i] = op(pa[i], vb);
                            } else if (s[1] == 0 && s[2] == 1) {
                              const float va = *pa;
                              for (int64_t i = 0; i < n; ++i) po[i] = op(va, pb[i]);
                            } else {
                              for (int64_t i = 0; i < n; ++i)
                                po[i] = op(pa[i * s[1]], pb[i * s[2]]);
                            }
                          });
  return out;
}

// out = op(x) elementwise; out is a fresh contiguous tensor.
template <typename Op>
Tensor unary_kernel(const Tensor& x, Op op) {
  HSGD_CHECK(x.defined(), "elementwise op: the input is undefined");
  const Tensor c = x.is_contiguous() ? x : x.detach().contiguous();
  Tensor out = empty(x.shape());
  const float* __restrict px = c.data();
  float* __restrict o = out.data();
  parallel_for(0, out.numel(), kElementwiseGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) o[i] = op(px[i]);
  });
  return out;
}

}  // namespace

// ---- binary ops ----

Tensor add(const Tensor& a, const Tensor& b, float alpha) {
  Tensor out = binary_kernel(a, b, [alpha](float x, float y) { return x + alpha * y; });
  if (autograd::needs_grad({a, b})) {
    autograd::record(out, "AddBackward", {a, b},
                     [sa = a.shape(), sb = b.shape(), alpha](const Tensor& g, const NeedsGrad& n) {
                       std::vector<Tensor> grads(2);
                       if (n[0]) grads[0] = sum_to(g, sa);
                       if (n[1]) grads[1] = alpha == 1.0f ? sum_to(g, sb) : sum_to(g * alpha, sb);
                       return grads;
                     });
  }
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) { return add(a, b, 1.0f); }
Tensor sub(const Tensor& a, const Tensor& b) { return add(a, b, -1.0f); }

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_kernel(a, b, [](float x, float y) { return x * y; });
  if (autograd::needs_grad({a, b})) {
    autograd::record(out, "MulBackward", {a, b},
                     [a = a.detach(), b = b.detach()](const Tensor& g, const NeedsGrad& n) {
                       std::vector<Tensor> grads(2);
                       if (n[0]) grads[0] = sum_to(mul(g, b), a.shape());
                       if (n[1]) grads[1] = sum_to(mul(g, a), b.shape());
                       return grads;
                     });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_kernel(a, b, [](float x, float y) { return x / y; });
  if (autograd::needs_grad({a, b})) {
    autograd::record(out, "DivBackward", {a, b},
                     [a = a.detach(), b = b.detach()](const Tensor& g, const NeedsGrad& n) {
                       std::vector<Tensor> grads(2);
                       if (n[0]) grads[0] = sum_to(div(g, b), a.shape());
                       if (n[1]) {
                         // d(a/b)/db = -a / b^2
                         Tensor gb = binary_kernel(mul(g, a), b,
                                                   [](float ga, float y) { return -ga / (y * y); });
                         grads[1] = sum_to(gb, b.shape());
                       }
                       return grads;
                     });
  }
  return out;
}

// ---- scalar forms ----

Tensor add(const Tensor& a, float s) {
  Tensor out = unary_kernel(a, [s](float x) { return x + s; });
  if (autograd::needs_grad({a})) {
    autograd::record(out, "AddScalarBackward", {a},
                     [](const Tensor& g, const NeedsGrad&) { return std::vector<Tensor>{g}; });
  }
  return out;
}

Tensor mul(const Tensor& a, float s) {
  Tensor out = unary_kernel(a, [s](float x) { return x * s; });
  if (autograd::needs_grad({a})) {
    autograd::record(out, "MulScalarBackward", {a}, [s](const Tensor& g, const NeedsGrad&) {
      return std::vector<Tensor>{mul(g, s)};
    });
  }
  return out;
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, float s) { return add(a, s); }
Tensor operator-(const Tensor& a, float s) { return add(a, -s); }
Tensor operator*(const Tensor& a, float s) { return mul(a, s); }
Tensor operator/(const Tensor& a, float s) { return mul(a, 1.0f / s); }
Tensor operator+(float s, const Tensor& a) { return add(a, s); }
Tensor operator-(float s, const Tensor& a) { return add(neg(a), s); }
Tensor operator*(float s, const Tensor& a) { return mul(a, s); }
Tensor operator/(float s, const Tensor& a) { return mul(pow(a, -1.0f), s); }
Tensor operator-(const Tensor& a) { return neg(a); }

// ---- unary ops ----

Tensor neg(const Tensor& x) { return mul(x, -1.0f); }

Tensor relu(const Tensor& x) {
  // std::max(v, 0) keeps NaN (as torch) and compiles to maxps.
  Tensor out = unary_kernel(x, [](float v) { return std::max(v, 0.0f); });
  if (autograd::needs_grad({x})) {
    // The output is saved (detached): y > 0 exactly where x > 0.
    autograd::record(
        out, "ReluBackward", {x}, [y = out.detach()](const Tensor& g, const NeedsGrad&) {
          return std::vector<Tensor>{
              binary_kernel(g, y, [](float gv, float yv) { return yv > 0.0f ? gv : 0.0f; })};
        });
  }
  return out;
}

Tensor exp(const Tensor& x) {
  Tensor out = unary_kernel(x, [](float v) { return std::exp(v); });
  if (autograd::needs_grad({x})) {
    autograd::record(out, "ExpBackward", {x},
                     [y = out.detach()](const Tensor& g, const NeedsGrad&) {
                       return std::vector<Tensor>{mul(g, y)};
                     });
  }
  return out;
}

Tensor log(const Tensor& x) {
  Tensor out = unary_kernel(x, [](float v) { return std::log(v); });
  if (autograd::needs_grad({x})) {
    autograd::record(out, "LogBackward", {x}, [x = x.detach()](const Tensor& g, const NeedsGrad&) {
      return std::vector<Tensor>{div(g, x)};
    });
  }
  return out;
}

Tensor sqrt(const Tensor& x) {
  Tensor out = unary_kernel(x, [](float v) { return std::sqrt(v); });
  if (autograd::needs_grad({x})) {
    autograd::record(
        out, "SqrtBackward", {x}, [y = out.detach()](const Tensor& g, const NeedsGrad&) {
          return std::vector<Tensor>{
              binary_kernel(g, y, [](float gv, float yv) { return gv / (2.0f * yv); })};
        });
  }
  return out;
}

Tensor pow(const Tensor& x, float exponent) {
  Tensor out = unary_kernel(
      x, [exponent](float v) { return exponent == 2.0f ? v * v : std::pow(v, exponent); });
  if (autograd::needs_grad({x})) {
    autograd::record(
        out, "PowBackward", {x}, [x = x.detach(), exponent](const Tensor& g, const NeedsGrad&) {
          return std::vector<Tensor>{binary_kernel(g, x, [exponent](float gv, float v) {
            return exponent == 0.0f ? 0.0f : gv * exponent * std::pow(v, exponent - 1);
          })};
        });
  }
  return out;
}

Tensor tanh(const Tensor& x) {
  Tensor out = unary_kernel(x, [](float v) { return std::tanh(v); });
  if (autograd::needs_grad({x})) {
    autograd::record(
        out, "TanhBackward", {x}, [y = out.detach()](const Tensor& g, const NeedsGrad&) {
          return std::vector<Tensor>{
              binary_kernel(g, y, [](float gv, float yv) { return gv * (1.0f - yv * yv); })};
        });
  }
  return out;
}

Tensor sigmoid(const Tensor& x) {
  Tensor out = unary_kernel(x, [](float v) { return 1.0f / (1.0f + std::exp(-v)); });
  if (autograd::needs_grad({x})) {
    autograd::record(
        out, "SigmoidBackward", {x}, [y = out.detach()](const Tensor& g, const NeedsGrad&) {
          return std::vector<Tensor>{
              binary_kernel(g, y, [](float gv, float yv) { return gv * yv * (1.0f - yv); })};
        });
  }
  return out;
}

Tensor abs(const Tensor& x) {
  Tensor out = unary_kernel(x, [](float v) { return std::fabs(v); });
  if (autograd::needs_grad({x})) {
    autograd::record(out, "AbsBackward", {x}, [x = x.detach()](const Tensor& g, const NeedsGrad&) {
      return std::vector<Tensor>{binary_kernel(
          g, x, [](float gv, float v) { return v > 0.0f ? gv : (v < 0.0f ? -gv : 0.0f); })};
    });
  }
  return out;
}

bool allclose(const Tensor& a, const Tensor& b, float rtol, float atol) {
  if (a.shape() != b.shape()) return false;
  const std::vector<float> va = a.to_vector();
  const std::vector<float> vb = b.to_vector();
  for (size_t i = 0; i < va.size(); ++i) {
    if (!(std::fabs(va[i] - vb[i]) <= atol + rtol * std::fabs(vb[i]))) return false;
  }
  return true;
}

}  // namespace hsgd
