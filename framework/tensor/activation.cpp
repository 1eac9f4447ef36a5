// gelu and silu, forward and backward (elementwise, one pass each way).

#include <string>

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/kernels/vec_math.h"
#include "framework/parallel/parallel.h"
#include "framework/tensor/nn_ops.h"

namespace hsgd {

using autograd::NeedsGrad;

namespace {

constexpr int64_t kGrain = 16384;

// y (n) = f(x (n)), and gx (n) = g (n) * f'(x (n)): one vecmath kernel each way.
using ForwardKernel = void (*)(const float* x, float* y, int64_t n, kernels::simd::Isa isa);
using BackwardKernel = void (*)(const float* g, const float* x, float* gx, int64_t n,
                                kernels::simd::Isa isa);

// y = f(x) elementwise over a contiguous copy of x; backward gx = g * df(x).
Tensor unary(const Tensor& x, const char* name, ForwardKernel f, BackwardKernel df) {
  HSGD_CHECK(x.defined(), name, ": the input is undefined");
  const Tensor xc = x.detach().contiguous();
  Tensor out = empty(x.shape());
  const float* px = xc.data();
  float* py = out.data();
  const kernels::simd::Isa isa = kernels::simd::conv_isa();
  parallel_for(0, xc.numel(), kGrain,
               [&](int64_t lo, int64_t hi) { f(px + lo, py + lo, hi - lo, isa); });
  if (autograd::needs_grad({x})) {
    autograd::record(out, std::string(name) + "Backward", {x},
                     [xc, df, isa](const Tensor& g, const NeedsGrad&) {
                       const Tensor gc = g.contiguous();
                       Tensor gx = empty(xc.shape());
                       const float* pg = gc.data();
                       const float* pxs = xc.data();
                       float* pgx = gx.data();
                       parallel_for(0, xc.numel(), kGrain, [&](int64_t lo, int64_t hi) {
                         df(pg + lo, pxs + lo, pgx + lo, hi - lo, isa);
                       });
                       return std::vector<Tensor>{gx};
                     });
  }
  return out;
}

}  // namespace

// In float, through erfc and a sigmoid written from exp(-|v|) (vec_math.h): the negative tails
// keep their relative precision, where 1 + erf(x) or 1 + tanh(u) in float would cancel.
Tensor gelu(const Tensor& x, const std::string& approximate) {
  if (approximate == "none") {
    return unary(x, "Gelu", kernels::vecmath::gelu, kernels::vecmath::gelu_backward);
  }
  HSGD_CHECK(approximate == "tanh", "gelu: approximate is '", approximate,
             "', expected 'none' or 'tanh'");
  return unary(x, "GeluTanh", kernels::vecmath::gelu_tanh, kernels::vecmath::gelu_tanh_backward);
}

Tensor silu(const Tensor& x) {
  return unary(x, "Silu", kernels::vecmath::silu, kernels::vecmath::silu_backward);
}

}  // namespace hsgd
