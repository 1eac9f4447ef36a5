#include <algorithm>
#include <cstring>

#include "comm/error.h"
#include "framework/kernels/conv_kernels.h"

// The unfold of a convolution's input (im2col) and its adjoint (col2im), and the geometry they
// share; the forward and backward passes built on them are in conv_kernels.cpp.

namespace hsgd::kernels {
namespace {

// For kernel column j, the output columns [lo, hi) whose input column ox*sw - pw + j lies inside
// [0, W); the others read padding.
struct ValidRange {
  int64_t lo, hi;
};

ValidRange valid_outputs(int64_t j, int64_t stride, int64_t pad, int64_t in, int64_t out) {
  const int64_t first = pad - j;  // smallest ox*stride that is valid
  const int64_t lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  const int64_t last = in - 1 + pad - j;  // largest ox*stride that is valid
  const int64_t hi = last < 0 ? 0 : std::min(out, last / stride + 1);
  return {std::min(lo, hi), hi};
}

// Visits every (row r of col, output row oy) pair of im2col with the offset of the matching input
// row in x, or -1 when that row lies in the padding. Shared by im2col and col2im so that they stay
// adjoint.
template <typename RowFn>
void for_each_unfolded_row(const Conv2dGeometry& g, RowFn&& fn) {
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t r = (c * g.kh + i) * g.kw + j;
        const ValidRange cols = valid_outputs(j, g.sw, g.pw, g.w, g.ow);
        const int64_t x_offset = j - g.pw;  // input column under output column 0
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          const int64_t iy = oy * g.sh - g.ph + i;
          const bool inside = iy >= 0 && iy < g.h;
          fn(r, oy, inside ? (c * g.h + iy) * g.w : int64_t{-1}, x_offset, cols);
        }
      }
    }
  }
}

// im2col for stride 1 with "same" width (OW == W, e.g. 3x3 with padding 1), the bulk of a
// ResNet. Then output index d = oy*OW + ox of row (c,i,j) reads input index d + shift of plane c
// for every valid position, so each row is one memcpy over its valid span; the copy also carries
// neighbouring-row values into the padding columns, which are zeroed afterwards. This replaces
// OH small copies per row, whose call overhead dominated on 8x8 maps.
void im2col_same_width(const float* x, const Conv2dGeometry& g, float* col, int64_t ld) {
  const int64_t h = g.h, w = g.w, oh = g.oh, ow = g.ow, plane = oh * ow;
  for (int64_t c = 0; c < g.c; ++c) {
    const float* xc = x + c * h * w;
    for (int64_t i = 0; i < g.kh; ++i) {
      const ValidRange rows = valid_outputs(i, 1, g.ph, h, oh);
      for (int64_t j = 0; j < g.kw; ++j) {
        float* dst = col + ((c * g.kh + i) * g.kw + j) * ld;
        const ValidRange cols = valid_outputs(j, 1, g.pw, w, ow);
        if (rows.lo >= rows.hi || cols.lo >= cols.hi) {
          std::fill(dst, dst + plane, 0.0f);
          continue;
        }
        std::fill(dst, dst + rows.lo * ow, 0.0f);
        std::fill(dst + rows.hi * ow, dst + plane, 0.0f);
        const int64_t shift = (i - g.ph) * w + (j - g.pw);
        const int64_t first = rows.lo * ow + cols.lo, last = (rows.hi - 1) * ow + cols.hi;
        std::memcpy(dst + first, xc + first + shift, sizeof(float) * (last - first));
        for (int64_t oy = rows.lo; oy < rows.hi; ++oy) {
          float* row = dst + oy * ow;
          for (int64_t ox = 0; ox < cols.lo; ++ox) row[ox] = 0.0f;
          for (int64_t ox = cols.hi; ox < ow; ++ox) row[ox] = 0.0f;
        }
      }
    }
  }
}

}  // namespace

Conv2dGeometry make_conv2d_geometry(int64_t n, int64_t c, int64_t h, int64_t w, int64_t o,
                                    int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                                    int64_t pw) {
  HSGD_CHECK(n > 0 && c > 0 && h > 0 && w > 0, "conv2d: input sizes (N,C,H,W) = (", n, ",", c, ",",
             h, ",", w, ") must all be positive");
  HSGD_CHECK(o > 0 && kh > 0 && kw > 0, "conv2d: weight sizes (O,kh,kw) = (", o, ",", kh, ",", kw,
             ") must all be positive");
  HSGD_CHECK(sh > 0 && sw > 0, "conv2d: stride (", sh, ",", sw, ") must be positive");
  HSGD_CHECK(ph >= 0 && pw >= 0, "conv2d: padding (", ph, ",", pw, ") must be non-negative");
  HSGD_CHECK(kh <= h + 2 * ph && kw <= w + 2 * pw, "conv2d: kernel (", kh, ",", kw,
             ") is larger than the padded input (", h + 2 * ph, ",", w + 2 * pw, ")");
  Conv2dGeometry g;
  g.n = n, g.c = c, g.h = h, g.w = w;
  g.o = o, g.kh = kh, g.kw = kw;
  g.sh = sh, g.sw = sw, g.ph = ph, g.pw = pw;
  g.oh = (h + 2 * ph - kh) / sh + 1;
  g.ow = (w + 2 * pw - kw) / sw + 1;
  return g;
}

void im2col(const float* x, const Conv2dGeometry& g, float* col, int64_t ld) {
  if (g.sh == 1 && g.sw == 1 && g.ow == g.w) {
    im2col_same_width(x, g, col, ld);
    return;
  }
  const int64_t ow = g.ow, sw = g.sw;
  for_each_unfolded_row(g, [&](int64_t r, int64_t oy, int64_t x_row, int64_t x_offset,
                               ValidRange cols) {
    float* dst = col + r * ld + oy * ow;
    if (x_row < 0) {
      std::fill(dst, dst + ow, 0.0f);
      return;
    }
    const float* src = x + x_row;  // src[ox * sw + x_offset] is the input under output column ox
    std::fill(dst, dst + cols.lo, 0.0f);
    if (sw == 1) {
      std::memcpy(dst + cols.lo, src + cols.lo + x_offset, sizeof(float) * (cols.hi - cols.lo));
    } else {
      for (int64_t ox = cols.lo; ox < cols.hi; ++ox) dst[ox] = src[ox * sw + x_offset];
    }
    std::fill(dst + cols.hi, dst + ow, 0.0f);
  });
}

void col2im(const float* col, const Conv2dGeometry& g, float* x, int64_t ld) {
  const int64_t ow = g.ow, sw = g.sw;
  for_each_unfolded_row(
      g, [&](int64_t r, int64_t oy, int64_t x_row, int64_t x_offset, ValidRange cols) {
        if (x_row < 0) return;  // padding receives no gradient
        // __restrict and a separate unit-stride loop let the compiler vectorise the adds.
        const float* __restrict src = col + r * ld + oy * ow;
        float* __restrict dst = x + x_row;
        if (sw == 1) {
          for (int64_t ox = cols.lo; ox < cols.hi; ++ox) dst[ox + x_offset] += src[ox];
        } else {
          for (int64_t ox = cols.lo; ox < cols.hi; ++ox) dst[ox * sw + x_offset] += src[ox];
        }
      });
}

}  // namespace hsgd::kernels
