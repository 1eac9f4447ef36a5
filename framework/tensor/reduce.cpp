// Reductions (sum, mean, argmax) and cat.

#include <algorithm>
#include <cstring>

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/tensor/ops.h"
#include "framework/tensor/tensor_impl.h"

namespace hsgd {

using autograd::NeedsGrad;

namespace {

int64_t wrap_dim(int64_t d, const Tensor& x, const char* op) {
  const int64_t n = x.dim();
  HSGD_CHECK(d >= -n && d < n, op, ": dim ", d, " out of range for shape ", shape_str(x.shape()));
  return d < 0 ? d + n : d;
}

// Sizes of x viewed as (outer, len, inner) around dim d.
struct Split {
  int64_t outer = 1, len = 1, inner = 1;
};

Split split_at(const Shape& s, int64_t d) {
  Split r;
  for (int64_t i = 0; i < d; ++i) r.outer *= s[i];
  r.len = s[d];
  for (size_t i = d + 1; i < s.size(); ++i) r.inner *= s[i];
  return r;
}

Shape reduced_shape(const Shape& s, int64_t d, bool keepdim) {
  Shape out = s;
  if (keepdim) {
    out[d] = 1;
  } else {
    out.erase(out.begin() + d);
  }
  return out;
}

// Sum of n contiguous floats. 16 independent float lanes (which the compiler vectorises) over
// blocks short enough that float rounding stays small, blocks added in double.
double sum_contiguous(const float* x, int64_t n) {
  constexpr int64_t kLanes = 16;
  constexpr int64_t kBlock = 1024;
  double total = 0;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    float lanes[kLanes] = {};
    for (int64_t j = 0; j < kBlock; j += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) lanes[l] += x[i + j + l];
    }
    for (float v : lanes) total += v;
  }
  for (; i < n; ++i) total += x[i];
  return total;
}

// out (outer, inner) = sum over len of x (outer, len, inner); x contiguous.
void sum_kernel(const float* x, const Split& sp, float* out) {
  if (sp.inner == 1) {
    for (int64_t o = 0; o < sp.outer; ++o) {
      out[o] = static_cast<float>(sum_contiguous(x + o * sp.len, sp.len));
    }
    return;
  }
  for (int64_t o = 0; o < sp.outer; ++o) {
    float* __restrict dst = out + o * sp.inner;
    std::fill(dst, dst + sp.inner, 0.0f);
    for (int64_t k = 0; k < sp.len; ++k) {
      const float* __restrict src = x + (o * sp.len + k) * sp.inner;
      for (int64_t i = 0; i < sp.inner; ++i) dst[i] += src[i];
    }
  }
}

}  // namespace

Tensor sum(const Tensor& x) {
  HSGD_CHECK(x.defined(), "sum: the input is undefined");
  const Tensor c = x.detach().contiguous();
  Tensor out = empty({});
  sum_kernel(c.data(), Split{1, c.numel(), 1}, out.data());
  if (autograd::needs_grad({x})) {
    autograd::record(out, "SumBackward", {x}, [s = x.shape()](const Tensor& g, const NeedsGrad&) {
      return std::vector<Tensor>{expand_copy(g, s)};
    });
  }
  return out;
}

Tensor sum(const Tensor& x, int64_t dim, bool keepdim) {
  HSGD_CHECK(x.defined(), "sum: the input is undefined");
  dim = wrap_dim(dim, x, "sum");
  const Tensor c = x.detach().contiguous();
  Tensor out = empty(reduced_shape(x.shape(), dim, keepdim));
  sum_kernel(c.data(), split_at(x.shape(), dim), out.data());
  if (autograd::needs_grad({x})) {
    autograd::record(
        out, "SumDimBackward", {x}, [s = x.shape(), dim](const Tensor& g, const NeedsGrad&) {
          // g has the reduced shape; put the size-1 dim back and broadcast.
          const Tensor gk = g.dim() == static_cast<int64_t>(s.size()) ? g : g.unsqueeze(dim);
          return std::vector<Tensor>{expand_copy(gk, s)};
        });
  }
  return out;
}

Tensor mean(const Tensor& x) {
  HSGD_CHECK(x.numel() > 0, "mean: the input is empty (shape ", shape_str(x.shape()), ")");
  return mul(sum(x), 1.0f / static_cast<float>(x.numel()));
}

Tensor mean(const Tensor& x, int64_t dim, bool keepdim) {
  const int64_t d = wrap_dim(dim, x, "mean");
  HSGD_CHECK(x.size(d) > 0, "mean: dim ", d, " of shape ", shape_str(x.shape()), " is empty");
  return mul(sum(x, d, keepdim), 1.0f / static_cast<float>(x.size(d)));
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  HSGD_CHECK(x.defined(), "argmax: the input is undefined");
  dim = wrap_dim(dim, x, "argmax");
  HSGD_CHECK(x.size(dim) > 0, "argmax: dim ", dim, " of shape ", shape_str(x.shape()), " is empty");
  const Tensor c = x.detach().contiguous();
  const Split sp = split_at(x.shape(), dim);
  Tensor out = empty(reduced_shape(x.shape(), dim, keepdim));
  const float* px = c.data();
  float* po = out.data();
  for (int64_t o = 0; o < sp.outer; ++o) {
    for (int64_t i = 0; i < sp.inner; ++i) {
      const float* base = px + o * sp.len * sp.inner + i;
      int64_t best = 0;
      for (int64_t k = 1; k < sp.len; ++k) {
        if (base[k * sp.inner] > base[best * sp.inner]) best = k;
      }
      po[o * sp.inner + i] = static_cast<float>(best);
    }
  }
  return out;
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  HSGD_CHECK(!tensors.empty(), "cat: needs at least one tensor");
  const Tensor& first = tensors[0];
  dim = wrap_dim(dim, first, "cat");
  Shape out_shape = first.shape();
  out_shape[dim] = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const Shape& s = tensors[t].shape();
    bool same = s.size() == first.shape().size();
    for (size_t i = 0; same && i < s.size(); ++i) {
      same = static_cast<int64_t>(i) == dim || s[i] == first.shape()[i];
    }
    HSGD_CHECK(same, "cat: tensor ", t, " has shape ", shape_str(s), ", expected ",
               shape_str(first.shape()), " except at dim ", dim);
    out_shape[dim] += s[dim];
  }
  Tensor out = empty(out_shape);
  std::vector<int64_t> sizes;
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    out.detach().narrow(dim, offset, t.size(dim)).copy_(t);
    sizes.push_back(t.size(dim));
    offset += t.size(dim);
  }
  if (autograd::needs_grad(tensors)) {
    autograd::record(out, "CatBackward", tensors,
                     [sizes, dim](const Tensor& g, const NeedsGrad& n) {
                       std::vector<Tensor> grads(sizes.size());
                       int64_t off = 0;
                       for (size_t i = 0; i < sizes.size(); ++i) {
                         if (n[i]) grads[i] = g.narrow(dim, off, sizes[i]).contiguous();
                         off += sizes[i];
                       }
                       return grads;
                     });
  }
  return out;
}

std::vector<int64_t> argmax_indices(const Tensor& x, int64_t dim) {
  const std::vector<float> indices = argmax(x, dim).to_vector();
  return std::vector<int64_t>(indices.begin(), indices.end());
}

}  // namespace hsgd
