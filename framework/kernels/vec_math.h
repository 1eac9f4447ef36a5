#pragma once
// Elementwise float math over arrays for the hot activations and softmaxes: exp, exact and
// tanh-approximate GELU, SiLU, forward and backward; and the row kernels of softmax, attention and
// LayerNorm (max, scale, dot, softmax backward, LayerNorm forward and backward of one row). For
// kernel code.
//
// Every function reads and writes n contiguous floats; outputs may alias inputs element for
// element (y == x), not partially overlap them. Each runs the AVX-512, AVX2+FMA or baseline
// (SSE2) path chosen by isa, by default the widest the CPU supports (simd::conv_isa()); tests pass
// each supported isa in turn. The paths round differently (FMA contraction, lane count of a sum)
// but each stays within the accuracy stated here, measured by tests/framework/kernels/
// vec_math_test.cpp against double-precision references:
//
//   exp             below 1 ulp with FMA (0.9 measured), 1.2 ulp on the baseline; subnormal
//                   results included. exp(-inf) = 0 and x < -103.98 give +0, x > 88.7228 gives
//                   +inf, like expf.
//   gelu            x Phi(x), Phi the standard normal CDF, through erfc so that the negative tail
//                   keeps its relative precision: within 7 ulp, forward and backward (PyTorch's
//                   float erf errs by up to 1.5e-7 absolute, a quarter of Phi(-5)).
//   gelu_tanh       x sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)): the rounding of the cubic moves the
//                   result by about 2u ulp (under 50 ulp for |x| <= 5, 220 near |x| = 10).
//   silu            x sigmoid(x): within 5 ulp, forward and backward.
//
//   max, scale, softmax_backward: exact (every path gives the scalar loop's bits).
//   dot, layer_norm(_backward): sums in float lanes, moved to double every few hundred
//                   elements; the results are within a few ulp of a double-precision row
//                   (float rounding of x - mean and of each product).
//
// A backward's error is in ulps of the larger of its two terms (gelu' = Phi + x phi crosses 0).
// NaN in gives NaN out. Infinite inputs follow the formulas, as PyTorch 1.13 does: gelu(+inf) =
// +inf, gelu(-inf) = -inf * 0 = NaN (likewise silu and every backward at +-inf).
//
// Usage:
//   const int64_t n = 1000;
//   std::vector<float> x(n, 0.5f), y(n);
//   hsgd::kernels::vecmath::gelu(x.data(), y.data(), n);
//   // a softmax row: y = exp(x - max) and its sum, then y / total
//   const float max = hsgd::kernels::vecmath::max(x.data(), n);
//   const double total = hsgd::kernels::vecmath::exp_shifted(x.data(), max, y.data(), n);
//   hsgd::kernels::vecmath::scale(y.data(), static_cast<float>(1.0 / total), y.data(), n);

#include <cstdint>

#include "framework/kernels/conv_simd.h"

namespace hsgd::kernels::vecmath {

// y (n) = exp(x (n)).
void exp(const float* x, float* y, int64_t n, simd::Isa isa = simd::conv_isa());

// y (n) = exp(x (n) - shift), with x - shift rounded to float first (as softmax computes it);
// returns sum(y), accumulated in float within blocks of a few hundred elements and in double
// across them. Entries x = -inf contribute exactly 0.
double exp_shifted(const float* x, float shift, float* y, int64_t n,
                   simd::Isa isa = simd::conv_isa());

// y (n) = gelu(x (n)) = x Phi(x), exact (erf) form.
void gelu(const float* x, float* y, int64_t n, simd::Isa isa = simd::conv_isa());

// gx (n) = g (n) * gelu'(x (n)), gelu'(x) = Phi(x) + x phi(x), phi the normal density.
void gelu_backward(const float* g, const float* x, float* gx, int64_t n,
                   simd::Isa isa = simd::conv_isa());

// y (n) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): torch's gelu(approximate='tanh').
void gelu_tanh(const float* x, float* y, int64_t n, simd::Isa isa = simd::conv_isa());

// gx (n) = g (n) * (s + 2 x s (1 - s) u'(x)), s = sigmoid(2u): the derivative of gelu_tanh.
void gelu_tanh_backward(const float* g, const float* x, float* gx, int64_t n,
                        simd::Isa isa = simd::conv_isa());

// y (n) = x sigmoid(x).
void silu(const float* x, float* y, int64_t n, simd::Isa isa = simd::conv_isa());

// gx (n) = g (n) * s (1 + x (1 - s)), s = sigmoid(x).
void silu_backward(const float* g, const float* x, float* gx, int64_t n,
                   simd::Isa isa = simd::conv_isa());

// ---- rows ----

// The largest entry of x (n); -inf when n == 0. NaN entries are skipped (as std::max(max, x[i])
// in a loop from -inf skips them).
float max(const float* x, int64_t n, simd::Isa isa = simd::conv_isa());

// y (n) = x (n) * s.
void scale(const float* x, float s, float* y, int64_t n, simd::Isa isa = simd::conv_isa());

// ds (n) = p (n) * (dp (n) - delta): the gradient of a softmax row p with respect to its input,
// given dp, the gradient with respect to p, and delta = sum(p * dp).
void softmax_backward(const float* p, const float* dp, float delta, float* ds, int64_t n,
                      simd::Isa isa = simd::conv_isa());

// sum(a (n) * b (n)): products and sums in float lanes, moved to double every few hundred
// elements (as exp_shifted sums).
double dot(const float* a, const float* b, int64_t n, simd::Isa isa = simd::conv_isa());

// One LayerNorm row x (k), k >= 1: xhat (k) = (x - mean) * rstd and y (k) = xhat * weight + bias,
// where mean and the biased variance var are x's and rstd = 1 / sqrt(var + eps); returns rstd.
// weight and bias may be null (then 1 and 0). y may alias x; xhat may not.
float layer_norm(const float* x, const float* weight, const float* bias, float eps, float* xhat,
                 float* y, int64_t k, simd::Isa isa = simd::conv_isa());

// The input gradient of that row: gx (k) = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)), gh =
// g (k) * weight (weight may be null: 1). gx may alias g.
void layer_norm_backward(const float* g, const float* xhat, const float* weight, float rstd,
                         float* gx, int64_t k, simd::Isa isa = simd::conv_isa());

}  // namespace hsgd::kernels::vecmath
