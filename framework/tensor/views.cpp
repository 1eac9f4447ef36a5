// Shape views of Tensor: reshape, view, flatten, transpose, permute, narrow, (un)squeeze, and
// split / chunk into narrow views.
// Each returns a new tensor object over the same storage and records a node whose backward
// maps the gradient back to the input's shape.

#include <algorithm>
#include <numeric>

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/tensor/ops.h"
#include "framework/tensor/tensor.h"
#include "framework/tensor/tensor_impl.h"

namespace hsgd {

Shape infer_shape(Shape shape, int64_t numel, const Shape& from, const char* op) {
  int64_t known = 1;
  int64_t infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      HSGD_CHECK(infer_at < 0, op, ": only one size may be -1, got ", shape_str(shape));
      infer_at = static_cast<int64_t>(i);
    } else {
      HSGD_CHECK(shape[i] >= 0, op, ": invalid size ", shape[i], " in ", shape_str(shape));
      known *= shape[i];
    }
  }
  if (infer_at >= 0) {
    HSGD_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape_str(shape),
               " is invalid for a tensor of shape ", shape_str(from), " (", numel, " elements)");
    shape[infer_at] = numel / known;
  }
  HSGD_CHECK(shape_numel(shape) == numel, op, ": shape ", shape_str(shape), " (",
             shape_numel(shape), " elements) is invalid for a tensor of shape ", shape_str(from),
             " (", numel, " elements)");
  return shape;
}

namespace {

int64_t wrap_dim(int64_t d, int64_t ndim, const char* op, const Shape& shape) {
  HSGD_CHECK(d >= -ndim && d < ndim, op, ": dim ", d, " out of range for shape ", shape_str(shape),
             " (expected ", -ndim, " <= dim < ", ndim, ")");
  return d < 0 ? d + ndim : d;
}

// Records a view op whose backward is `to_input(g)`.
template <typename Backward>
Tensor finish_view(const Tensor& input, std::shared_ptr<TensorImpl> impl, const char* name,
                   Backward to_input) {
  Tensor out(std::move(impl));
  if (autograd::needs_grad({input})) {
    autograd::record(out, name, {input}, [to_input](const Tensor& g, const autograd::NeedsGrad&) {
      return std::vector<Tensor>{to_input(g)};
    });
  }
  return out;
}

}  // namespace

Tensor Tensor::view(Shape shape) const {
  const Shape& from = this->shape();
  shape = infer_shape(std::move(shape), numel(), from, "Tensor::view");
  HSGD_CHECK(is_contiguous(), "Tensor::view: needs a contiguous tensor, got shape ",
             shape_str(from), " with strides ", shape_str(strides()), "; use reshape()");
  std::vector<int64_t> strides = contiguous_strides(shape);
  return finish_view(*this, make_view_impl(*this, shape, std::move(strides), impl_->offset),
                     "ViewBackward", [from](const Tensor& g) { return g.reshape(from); });
}

Tensor Tensor::reshape(Shape shape) const {
  if (is_contiguous()) return view(std::move(shape));
  return contiguous().view(std::move(shape));
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  const Shape& s = shape();
  const int64_t n = dim();
  if (n == 0) return reshape({1});
  start = wrap_dim(start, n, "Tensor::flatten", s);
  end = wrap_dim(end, n, "Tensor::flatten", s);
  HSGD_CHECK(start <= end, "Tensor::flatten: start dim ", start, " must not be after end dim ",
             end);
  Shape out(s.begin(), s.begin() + start);
  out.push_back(std::accumulate(s.begin() + start, s.begin() + end + 1, int64_t{1},
                                std::multiplies<int64_t>()));
  out.insert(out.end(), s.begin() + end + 1, s.end());
  return reshape(std::move(out));
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  const Shape& s = shape();
  const int64_t n = dim();
  HSGD_CHECK(static_cast<int64_t>(dims.size()) == n, "Tensor::permute: got ", dims.size(), " dims ",
             shape_str(dims), " for a tensor of shape ", shape_str(s));
  Shape shape(n);
  std::vector<int64_t> strides(n);
  std::vector<int64_t> inverse(n, -1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t d = wrap_dim(dims[i], n, "Tensor::permute", s);
    HSGD_CHECK(inverse[d] < 0, "Tensor::permute: dim ", d, " repeated in ", shape_str(dims));
    inverse[d] = i;
    shape[i] = s[d];
    strides[i] = impl_->strides[d];
  }
  return finish_view(*this, make_view_impl(*this, shape, strides, impl_->offset), "PermuteBackward",
                     [inverse](const Tensor& g) { return g.permute(inverse); });
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  const int64_t n = dim();
  d0 = wrap_dim(d0, n, "Tensor::transpose", shape());
  d1 = wrap_dim(d1, n, "Tensor::transpose", shape());
  Shape shape = impl_->shape;
  std::vector<int64_t> strides = impl_->strides;
  std::swap(shape[d0], shape[d1]);
  std::swap(strides[d0], strides[d1]);
  return finish_view(*this, make_view_impl(*this, shape, strides, impl_->offset),
                     "TransposeBackward",
                     [d0, d1](const Tensor& g) { return g.transpose(d0, d1); });
}

Tensor Tensor::t() const {
  HSGD_CHECK(dim() == 2, "Tensor::t: needs a 2-D tensor, got shape ", shape_str(shape()));
  return transpose(0, 1);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  const Shape& s = shape();
  d = wrap_dim(d, dim(), "Tensor::narrow", s);
  HSGD_CHECK(start >= 0 && length >= 0 && start + length <= s[d], "Tensor::narrow: range [", start,
             ", ", start + length, ") out of bounds for dim ", d, " of shape ", shape_str(s));
  Shape shape = s;
  shape[d] = length;
  const int64_t offset = impl_->offset + start * impl_->strides[d];
  return finish_view(*this, make_view_impl(*this, shape, impl_->strides, offset), "NarrowBackward",
                     [s, d, start, length](const Tensor& g) {
                       Tensor full = zeros(s);
                       full.narrow(d, start, length).copy_(g);
                       return full;
                     });
}

Tensor Tensor::unsqueeze(int64_t d) const {
  const int64_t n = dim();
  d = wrap_dim(d, n + 1, "Tensor::unsqueeze", shape());
  Shape shape = impl_->shape;
  std::vector<int64_t> strides = impl_->strides;
  const int64_t stride = d < n ? impl_->strides[d] * impl_->shape[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  const Shape from = impl_->shape;
  return finish_view(*this, make_view_impl(*this, shape, strides, impl_->offset),
                     "UnsqueezeBackward", [from](const Tensor& g) { return g.reshape(from); });
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim(), "Tensor::squeeze", shape());
  HSGD_CHECK(impl_->shape[d] == 1, "Tensor::squeeze: dim ", d, " has size ", impl_->shape[d],
             ", expected 1 (shape ", shape_str(impl_->shape), ")");
  Shape shape = impl_->shape;
  std::vector<int64_t> strides = impl_->strides;
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  const Shape from = impl_->shape;
  return finish_view(*this, make_view_impl(*this, shape, strides, impl_->offset), "SqueezeBackward",
                     [from](const Tensor& g) { return g.reshape(from); });
}

// ---- free-function forms ----

Tensor reshape(const Tensor& x, Shape shape) { return x.reshape(std::move(shape)); }
Tensor flatten(const Tensor& x, int64_t start, int64_t end) { return x.flatten(start, end); }
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) { return x.transpose(d0, d1); }

// ---- split and chunk: narrow() views, so each piece's gradient flows back through
// NarrowBackward and the engine adds the pieces' contributions up ----

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  HSGD_CHECK(x.defined(), "split: the input is undefined");
  dim = wrap_dim(dim, x.dim(), "split", x.shape());
  int64_t total = 0;
  for (int64_t s : sizes) {
    HSGD_CHECK(s >= 0, "split: sizes ", shape_str(sizes), " must be non-negative");
    total += s;
  }
  HSGD_CHECK(total == x.size(dim), "split: sizes ", shape_str(sizes), " add up to ", total,
             ", expected the size ", x.size(dim), " of dim ", dim, " of shape ",
             shape_str(x.shape()));
  std::vector<Tensor> pieces;
  pieces.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t s : sizes) {
    pieces.push_back(x.narrow(dim, start, s));
    start += s;
  }
  return pieces;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  HSGD_CHECK(x.defined(), "split: the input is undefined");
  dim = wrap_dim(dim, x.dim(), "split", x.shape());
  const int64_t n = x.size(dim);
  HSGD_CHECK(split_size > 0 || (split_size == 0 && n == 0), "split: split_size ", split_size,
             " must be >= 1 (0 only for an empty dim; dim ", dim, " of shape ",
             shape_str(x.shape()), " has size ", n, ")");
  // One piece even for an empty dim, as torch.
  const int64_t count =
      split_size == 0 ? 1 : std::max<int64_t>((n + split_size - 1) / split_size, 1);
  std::vector<int64_t> sizes(count, split_size);
  sizes.back() = n - split_size * (count - 1);
  return split(x, sizes, dim);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  HSGD_CHECK(x.defined(), "chunk: the input is undefined");
  HSGD_CHECK(chunks >= 1, "chunk: chunks ", chunks, " must be >= 1");
  dim = wrap_dim(dim, x.dim(), "chunk", x.shape());
  // An empty dim gives `chunks` empty pieces (torch), not split's single one.
  if (x.size(dim) == 0) return split(x, std::vector<int64_t>(chunks, 0), dim);
  return split(x, (x.size(dim) + chunks - 1) / chunks, dim);
}

}  // namespace hsgd
