// dropout: draws a scaled keep-mask from the generator and multiplies, so autograd sees a plain
// mul by a constant and no dedicated backward node is needed.

#include <cmath>
#include <cstdint>

#include "comm/error.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"

namespace hsgd {

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  HSGD_CHECK(x.defined(), "dropout: input must be defined");
  HSGD_CHECK(p >= 0.0 && p < 1.0, "dropout: probability p = ", p, " must be in [0, 1)");
  if (!training || p == 0.0) return x;

  // An element survives when a 32-bit uniform draw is below (1-p) * 2^32: two elements per
  // 64-bit draw, without a per-element floating-point conversion.
  const double keep = 1.0 - p;
  const uint64_t threshold = static_cast<uint64_t>(std::ldexp(keep, 32));
  const float scale = static_cast<float>(1.0 / keep);
  Tensor mask = empty(x.shape());
  float* m = mask.data();
  const int64_t n = mask.numel();
  int64_t i = 0;
  for (; i + 2 <= n; i += 2) {
    const uint64_t bits = gen.next_u64();
    m[i] = (bits & 0xffffffffu) < threshold ? scale : 0.0f;
    m[i + 1] = (bits >> 32) < threshold ? scale : 0.0f;
  }
  if (i < n) m[i] = (gen.next_u64() & 0xffffffffu) < threshold ? scale : 0.0f;
  return mul(x, mask);
}

}  // namespace hsgd
