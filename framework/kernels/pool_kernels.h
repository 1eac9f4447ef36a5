#pragma once
// Raw float kernels behind hsgd::max_pool2d, avg_pool2d and adaptive_avg_pool2d. Pooling acts on
// each (sample, channel) plane independently, so every kernel sees the input as P = N*C planes:
// x is (P,H,W) and y is (P,OH,OW), dense row-major. The differentiable ops are in pool.cpp.
//
// Semantics follow torch.nn.functional with ceil_mode=False: OH = (H + 2*ph - kh) / sh + 1;
// max pooling pads with -inf and propagates NaN; average pooling counts the zero padding in the
// divisor (count_include_pad=True), which with ceil_mode=False makes it always kh*kw.

#include <cstdint>

namespace hsgd::kernels {

struct Pool2dGeometry {
  int64_t planes = 0, h = 0, w = 0;  // x is (P,H,W) with P = N*C
  int64_t kh = 0, kw = 0;            // window
  int64_t sh = 1, sw = 1;            // stride
  int64_t ph = 0, pw = 0;            // padding on each side
  int64_t oh = 0, ow = 0;            // y is (P,OH,OW)
};

// Validates a pooling window (positive kernel and stride, 0 <= padding <= kernel/2 as PyTorch
// requires, kernel within the padded input) and computes the output size. `op` names the caller
// in the error message. Throws hsgd::InvalidArgument.
Pool2dGeometry make_pool2d_geometry(const char* op, int64_t planes, int64_t h, int64_t w,
                                    int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                                    int64_t pw);

// y[p,oy,ox] = max over the window; argmax[p,oy,ox] = index (iy*W + ix) of that maximum inside
// its plane, which backward uses. A window lying entirely in the padding cannot occur because
// padding <= kernel/2.
void max_pool2d_forward(const float* x, const Pool2dGeometry& g, float* y, int32_t* argmax);
// gx (P,H,W) is overwritten: each gy entry is added to the input position that won.
void max_pool2d_backward(const float* gy, const int32_t* argmax, const Pool2dGeometry& g,
                         float* gx);

// y = window sum / (kh*kw).
void avg_pool2d_forward(const float* x, const Pool2dGeometry& g, float* y);
// gx (P,H,W) is overwritten.
void avg_pool2d_backward(const float* gy, const Pool2dGeometry& g, float* gx);

// Adaptive average pooling to (OH,OW): output row i averages input rows
// floor(i*H/OH) .. ceil((i+1)*H/OH) - 1 (and likewise for columns). x is (P,H,W), y (P,OH,OW).
void adaptive_avg_pool2d_forward(const float* x, int64_t planes, int64_t h, int64_t w, int64_t oh,
                                 int64_t ow, float* y);
// gx (P,H,W) is overwritten.
void adaptive_avg_pool2d_backward(const float* gy, int64_t planes, int64_t h, int64_t w, int64_t oh,
                                  int64_t ow, float* gx);

}  // namespace hsgd::kernels
