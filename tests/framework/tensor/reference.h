#pragma once
// Direct-loop reference implementations for the tensor-op and kernel tests: the textbook definitions,
// written independently of the im2col / window-clipping kernels they check. Row-major vectors.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace hsgd::testing {

// y[n,o,oy,ox] = b[o] + sum_{c,i,j} x[n,c,oy*s-p+i,ox*s-p+j] * w[o,c,i,j] (zero outside x).
inline std::vector<float> reference_conv2d(const std::vector<float>& x, const std::vector<float>& w,
                                           const std::vector<float>* b, int64_t n, int64_t c,
                                           int64_t h, int64_t wd, int64_t o, int64_t kh, int64_t kw,
                                           int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  const int64_t oh = (h + 2 * ph - kh) / sh + 1, ow = (wd + 2 * pw - kw) / sw + 1;
  std::vector<float> y(n * o * oh * ow);
  for (int64_t s = 0; s < n; ++s)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          double acc = b ? (*b)[oc] : 0.0;
          for (int64_t ic = 0; ic < c; ++ic)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t iy = oy * sh - ph + i, ix = ox * sw - pw + j;
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                acc += double(x[((s * c + ic) * h + iy) * wd + ix]) *
                       w[((oc * c + ic) * kh + i) * kw + j];
              }
          y[((s * o + oc) * oh + oy) * ow + ox] = static_cast<float>(acc);
        }
  return y;
}

// Pooling over planes (P,H,W): max with -inf padding, or mean dividing by kh*kw.
inline std::vector<float> reference_pool2d(const std::vector<float>& x, int64_t planes, int64_t h,
                                           int64_t w, int64_t kh, int64_t kw, int64_t sh,
                                           int64_t sw, int64_t ph, int64_t pw, bool max) {
  const int64_t oh = (h + 2 * ph - kh) / sh + 1, ow = (w + 2 * pw - kw) / sw + 1;
  std::vector<float> y(planes * oh * ow);
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox) {
        double acc = max ? -std::numeric_limits<double>::infinity() : 0.0;
        for (int64_t i = 0; i < kh; ++i)
          for (int64_t j = 0; j < kw; ++j) {
            const int64_t iy = oy * sh - ph + i, ix = ox * sw - pw + j;
            const bool inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
            const double v = inside ? x[(p * h + iy) * w + ix]
                                    : (max ? -std::numeric_limits<double>::infinity() : 0.0);
            acc = max ? std::max(acc, v) : acc + v;
          }
        y[(p * oh + oy) * ow + ox] = static_cast<float>(max ? acc : acc / double(kh * kw));
      }
  return y;
}

// Adaptive average pooling: output cell (i,j) is the mean of the input cells whose centre-line
// interval [r, r+1) intersects [i*H/OH, (i+1)*H/OH) with positive length (equivalently rows
// floor(i*H/OH) .. ceil((i+1)*H/OH)-1), computed here with exact rational comparisons.
inline std::vector<float> reference_adaptive_avg_pool2d(const std::vector<float>& x, int64_t planes,
                                                        int64_t h, int64_t w, int64_t oh,
                                                        int64_t ow) {
  // Row r belongs to bin i when r+1 > i*H/OH and r < (i+1)*H/OH, i.e. (r+1)*OH > i*H and
  // r*OH < (i+1)*H.
  auto in_bin = [](int64_t r, int64_t i, int64_t in, int64_t out) {
    return (r + 1) * out > i * in && r * out < (i + 1) * in;
  };
  std::vector<float> y(planes * oh * ow);
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        double acc = 0;
        int64_t count = 0;
        for (int64_t r = 0; r < h; ++r) {
          if (!in_bin(r, i, h, oh)) continue;
          for (int64_t q = 0; q < w; ++q) {
            if (!in_bin(q, j, w, ow)) continue;
            acc += x[(p * h + r) * w + q];
            ++count;
          }
        }
        y[(p * oh + i) * ow + j] = static_cast<float>(acc / double(count));
      }
  return y;
}

}  // namespace hsgd::testing
