// gelu and silu, forward and backward (elementwise, one pass each way).

#include <cmath>
#include <string>

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/parallel/parallel.h"
#include "framework/tensor/nn_ops.h"

namespace hsgd {

using autograd::NeedsGrad;

namespace {

constexpr int64_t kGrain = 16384;
constexpr double kSqrtHalf = 0.70710678118654752;     // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143268;   // 1 / sqrt(2 pi)
constexpr double kSqrt2OverPi = 0.79788456080286536;  // sqrt(2 / pi)
constexpr double kTanhCubic = 0.044715;

// y = f(x) elementwise over a contiguous copy of x; backward gx = g * df(x).
template <typename Forward, typename Derivative>
Tensor unary(const Tensor& x, const char* name, Forward f, Derivative df) {
  HSGD_CHECK(x.defined(), name, ": the input is undefined");
  const Tensor xc = x.detach().contiguous();
  Tensor out = empty(x.shape());
  const float* px = xc.data();
  float* py = out.data();
  parallel_for(0, xc.numel(), kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) py[i] = f(px[i]);
  });
  if (autograd::needs_grad({x})) {
    autograd::record(out, std::string(name) + "Backward", {x},
                     [xc, df](const Tensor& g, const NeedsGrad&) {
                       const Tensor gc = g.contiguous();
                       Tensor gx = empty(xc.shape());
                       const float* pg = gc.data();
                       const float* pxs = xc.data();
                       float* pgx = gx.data();
                       parallel_for(0, xc.numel(), kGrain, [&](int64_t lo, int64_t hi) {
                         for (int64_t i = lo; i < hi; ++i) pgx[i] = pg[i] * df(pxs[i]);
                       });
                       return std::vector<Tensor>{gx};
                     });
  }
  return out;
}

}  // namespace

// The functions are evaluated in double and rounded once: for large |x| the float forms lose
// the small tails (1 + tanh(u) for u << 0), which then differ from torch by more than rounding.
Tensor gelu(const Tensor& x, const std::string& approximate) {
  if (approximate == "none") {
    return unary(
        x, "Gelu",
        [](float f) {
          const double v = f;
          return static_cast<float>(v * 0.5 * std::erfc(-v * kSqrtHalf));
        },
        [](float f) {
          const double v = f;
          const double cdf = 0.5 * std::erfc(-v * kSqrtHalf);
          return static_cast<float>(cdf + v * kInvSqrt2Pi * std::exp(-0.5 * v * v));
        });
  }
  HSGD_CHECK(approximate == "tanh", "gelu: approximate is '", approximate,
             "', expected 'none' or 'tanh'");
  // With u = sqrt(2/pi) (x + 0.044715 x^3) and s = sigmoid(2u): 0.5 (1 + tanh(u)) = s and
  // 1 - tanh(u)^2 = 4 s (1 - s), which keep their precision where tanh(u) is close to -1.
  return unary(
      x, "GeluTanh",
      [](float f) {
        const double v = f;
        const double u = kSqrt2OverPi * (v + kTanhCubic * v * v * v);
        return static_cast<float>(v / (1.0 + std::exp(-2.0 * u)));
      },
      [](float f) {
        const double v = f;
        const double u = kSqrt2OverPi * (v + kTanhCubic * v * v * v);
        const double s = 1.0 / (1.0 + std::exp(-2.0 * u));
        const double du = kSqrt2OverPi * (1.0 + 3.0 * kTanhCubic * v * v);
        return static_cast<float>(s + 2.0 * v * s * (1.0 - s) * du);
      });
}

Tensor silu(const Tensor& x) {
  return unary(
      x, "Silu",
      [](float f) {
        const double v = f;
        return static_cast<float>(v / (1.0 + std::exp(-v)));
      },
      [](float f) {
        const double v = f;
        const double s = 1.0 / (1.0 + std::exp(-v));
        return static_cast<float>(s * (1.0 + v * (1.0 - s)));
      });
}

}  // namespace hsgd
