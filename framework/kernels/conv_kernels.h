#pragma once
// Raw float kernels behind hsgd::conv2d: im2col/col2im and the sgemm-based forward and backward
// passes. They know nothing of Tensor or autograd; every pointer is a dense row-major buffer whose
// shape is given in the comment. The differentiable op that wraps them is in conv.cpp.
//
// Strategy: unfold a block of samples into a column matrix and multiply by the weight matrix
// (as PyTorch's slow_conv2d), with conv_gemm.h's products (cblas_sgemm, or on AVX-512 kernels
// suited to these small operands). 3x3, stride-1, padding-1 convs with 8 or more input channels
// instead take the Winograd kernels of conv_winograd.h. Samples are unfolded in blocks so that the
// gemm stays wide when the output map is small (late ResNet stages have 4x4 or 8x8 maps); a 1x1,
// stride-1, unpadded conv whose block is a single sample skips the unfold entirely. Backward of
// a stride-1 conv with 16+ input channels unfolds gy once and gets both gradients from it (gx as
// a transposed conv with the flipped kernel, gw from the same columns); other convs unfold x for
// gw and fold the input-gradient columns back with col2im.

#include <cstdint>

namespace hsgd::kernels {

// Sizes of one conv2d call. Built (and validated) by make_conv2d_geometry.
struct Conv2dGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;  // input x is (N,C,H,W)
  int64_t o = 0, kh = 0, kw = 0;       // weight is (O,C,kh,kw)
  int64_t sh = 1, sw = 1;              // stride
  int64_t ph = 0, pw = 0;              // zero padding on each side
  int64_t oh = 0, ow = 0;              // output y is (N,O,OH,OW)

  int64_t col_rows() const { return c * kh * kw; }
  int64_t out_plane() const { return oh * ow; }
  int64_t in_plane() const { return h * w; }
  // 1x1 kernel, stride 1, no padding: the unfolded matrix of one sample is the sample itself.
  bool is_pointwise() const {
    return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0;
  }
};

// Checks the sizes (all positive, padding non-negative, kernel fits in the padded input) and
// computes the output size OH = (H + 2*ph - kh) / sh + 1. Throws hsgd::InvalidArgument naming
// the bad value.
Conv2dGeometry make_conv2d_geometry(int64_t n, int64_t c, int64_t h, int64_t w, int64_t o,
                                    int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                                    int64_t pw);

// Unfolds one sample. x is (C,H,W); col is (C*kh*kw, ld) and row r = (c*kh + i)*kw + j receives
// the OH*OW input values seen by kernel tap (c,i,j), zeros where the tap falls in the padding.
// ld >= OH*OW lets several samples share one column matrix side by side.
void im2col(const float* x, const Conv2dGeometry& g, float* col, int64_t ld);

// The adjoint of im2col: adds every entry of col, (C*kh*kw, ld), into the input position it was
// read from. x is (C,H,W) and is accumulated into, not overwritten.
void col2im(const float* col, const Conv2dGeometry& g, float* x, int64_t ld);

// y = conv2d(x, w) + b. x is (N,C,H,W), w is (O,C,kh,kw), b is (O) or null, y is (N,O,OH,OW)
// and is overwritten.
void conv2d_forward(const float* x, const float* w, const float* b, const Conv2dGeometry& g,
                    float* y);

// Gradients of conv2d_forward. gy is (N,O,OH,OW). Each output may be null when not wanted and
// is overwritten otherwise: gx is (N,C,H,W), gw is (O,C,kh,kw), gb is (O).
void conv2d_backward(const float* x, const float* w, const float* gy, const Conv2dGeometry& g,
                     float* gx, float* gw, float* gb);

}  // namespace hsgd::kernels
