#pragma once
// Winograd kernels for 3x3, stride-1, padding-1 convolutions, the bulk of a CIFAR ResNet.
// Like conv_kernels.h they know nothing of Tensor; every pointer is a dense row-major buffer.
//
// Winograd F(2x2, 3x3) (Lavin & Gray, arXiv 1509.09308) computes a 2x2 output tile from a 4x4
// input tile with 16 multiplications per (input, output) channel pair instead of 36: every tile
// is transformed (V = B^T d B), the weights are transformed once (U = G g G^T), and for each of
// the 16 transform positions the channel sum is one matrix product,
// M (K, tiles) = U (K, C) * V (C, tiles); the output tile is A^T M A. Tiles are processed in
// blocks sized so that V and M of a block stay in L2, and the transforms run on 16 tiles at a
// time in SIMD lanes (AVX-512 or SSE2; 8 on AVX2), the code chosen at run time.
//
// The input gradient is the same convolution of gy with the flipped, transposed weights. The
// weight gradient is the adjoint of the forward: dU (K, C) = sum over tiles of (A gy A^T) V^T,
// then gw = G^T dU G.
//
// F(2x2) multiplies 2.25x less than im2col and stays within 1e-4 of it per element. F(4x4)
// (4x less) was tried and dropped: its errors on outputs near zero broke the 1e-4 golden
// tolerance, and with 8x8 maps its 6x6 tiles were slower here anyway.

#include <cstdint>

#include "framework/kernels/conv_kernels.h"
#include "framework/kernels/conv_simd.h"

namespace hsgd::kernels {

// True for the convolutions these kernels handle: 3x3 kernel, stride 1, padding 1.
bool winograd_applies(const Conv2dGeometry& g);

// y = conv2d(x, w) without bias. x is (N,C,H,W), w is (O,C,3,3), y is (N,O,H,W) and is
// overwritten. Throws hsgd::InvalidArgument unless winograd_applies(g). isa selects the SIMD
// code (tests pass each one the CPU supports); it must be supported by the CPU.
void winograd_conv2d_forward(const float* x, const float* w, const Conv2dGeometry& g, float* y,
                             simd::Isa isa = simd::conv_isa());

// Gradients of winograd_conv2d_forward for gy (N,O,H,W). gx (N,C,H,W) and gw (O,C,3,3) may each
// be null when not wanted and are overwritten otherwise. Throws hsgd::InvalidArgument unless
// winograd_applies(g).
void winograd_conv2d_backward(const float* x, const float* w, const float* gy,
                              const Conv2dGeometry& g, float* gx, float* gw,
                              simd::Isa isa = simd::conv_isa());

}  // namespace hsgd::kernels
