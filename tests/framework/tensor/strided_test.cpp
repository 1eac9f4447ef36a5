// Randomised layouts: elementwise ops, copy_ and reductions on permuted, narrowed and broadcast
// views against element-by-element index arithmetic on the raw strides.

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "framework/tensor/ops.h"

namespace hsgd {
namespace {

// Element at multi-index idx (aligned right for broadcasting: missing or size-1 dims read 0).
float at(const Tensor& t, const std::vector<int64_t>& idx) {
  const int64_t lead = static_cast<int64_t>(idx.size()) - t.dim();
  int64_t offset = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t i = t.size(d) == 1 ? 0 : idx[lead + d];
    offset += i * t.strides()[d];
  }
  return t.data()[offset];
}

// Calls f(idx) for every multi-index of shape, row-major.
template <typename F>
void for_each_index(const Shape& shape, F f) {
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t n = 0; n < shape_numel(shape); ++n) {
    f(idx);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

// A random view: a permuted, possibly narrowed tensor of `dims` dims.
Tensor random_view(Generator& gen, int64_t dims) {
  Shape shape;
  for (int64_t d = 0; d < dims; ++d) shape.push_back(1 + static_cast<int64_t>(gen.next_below(4)));
  Tensor t = randn(shape, gen);
  std::vector<int64_t> perm(dims);
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = dims - 1; i > 0; --i) std::swap(perm[i], perm[gen.next_below(i + 1)]);
  t = t.permute(perm);
  const int64_t d = static_cast<int64_t>(gen.next_below(dims));
  if (t.size(d) > 1) t = t.narrow(d, 1, t.size(d) - 1);
  return t;
}

// A contiguous tensor broadcastable to shape: some dims set to 1, some leading dims dropped.
Tensor random_broadcastable(Generator& gen, const Shape& shape) {
  Shape s(shape.begin() + gen.next_below(shape.size() + 1), shape.end());
  for (int64_t& v : s) {
    if (gen.next_below(3) == 0) v = 1;
  }
  return randn(s, gen);
}

TEST(StridedTest, ElementwiseOnRandomLayouts) {
  Generator gen(99);
  for (int trial = 0; trial < 300; ++trial) {
    Tensor a = random_view(gen, 1 + static_cast<int64_t>(gen.next_below(4)));
    Tensor b = random_broadcastable(gen, a.shape());
    // A strided operand too (a transpose that keeps the shape).
    if (b.dim() > 1 && b.size(0) == b.size(-1) && gen.next_below(2)) b = b.transpose(0, -1);
    if (broadcast_shapes(a.shape(), b.shape()) != a.shape()) continue;
    SCOPED_TRACE(shape_str(a.shape()) + " strides " + shape_str(a.strides()) + " with " +
                 shape_str(b.shape()) + " strides " + shape_str(b.strides()));
    const Tensor sum_ab = a + b, prod = a * b, r = relu(a);
    const std::vector<float> vs = sum_ab.to_vector(), vp = prod.to_vector(), vr = r.to_vector();
    int64_t flat = 0;
    bool ok = true;
    for_each_index(a.shape(), [&](const std::vector<int64_t>& idx) {
      const float x = at(a, idx), y = at(b, idx);
      ok = ok && vs[flat] == x + y && vp[flat] == x * y && vr[flat] == std::max(x, 0.0f);
      ++flat;
    });
    EXPECT_TRUE(ok);
    // copy_ into a strided destination, and add_.
    Tensor target = random_view(gen, a.dim());
    if (target.shape() == a.shape()) {
      target.copy_(b);
      target.add_(a, 2.0f);
      bool ok2 = true;
      for_each_index(a.shape(), [&](const std::vector<int64_t>& idx) {
        ok2 = ok2 && at(target, idx) == at(b, idx) + 2.0f * at(a, idx);
      });
      EXPECT_TRUE(ok2);
    }
  }
}

TEST(StridedTest, SumOverEachDimOfRandomLayouts) {
  Generator gen(7);
  for (int trial = 0; trial < 100; ++trial) {
    Tensor a = random_view(gen, 1 + static_cast<int64_t>(gen.next_below(4)));
    for (int64_t d = 0; d < a.dim(); ++d) {
      const Tensor s = sum(a, d, true);
      bool ok = true;
      for_each_index(s.shape(), [&](const std::vector<int64_t>& idx) {
        double expected = 0;
        std::vector<int64_t> j = idx;
        for (j[d] = 0; j[d] < a.size(d); ++j[d]) expected += at(a, j);
        ok = ok && std::abs(at(s, idx) - expected) <= 1e-5 * (1 + std::abs(expected));
      });
      EXPECT_TRUE(ok) << shape_str(a.shape()) << " dim " << d;
    }
  }
}

}  // namespace
}  // namespace hsgd
