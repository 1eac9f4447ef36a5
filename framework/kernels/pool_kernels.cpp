#include "framework/kernels/pool_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "comm/error.h"
#include "framework/parallel/parallel.h"

namespace hsgd::kernels {
namespace {

// Planes per chunk of the pool: at least 16K input floats, so small tensors stay on one thread.
// Every plane is computed by one thread, so results do not depend on the thread count.
int64_t plane_grain(int64_t plane_floats) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, plane_floats));
}

// The clipped window of one output position along one axis: input indices [begin, end).
struct Span {
  int64_t begin, end;
};

Span window(int64_t out_index, int64_t stride, int64_t pad, int64_t kernel, int64_t in) {
  const int64_t start = out_index * stride - pad;
  return {std::max<int64_t>(start, 0), std::min(start + kernel, in)};
}

// Row i of adaptive pooling covers [floor(i*in/out), ceil((i+1)*in/out)).
Span adaptive_window(int64_t i, int64_t in, int64_t out) {
  return {(i * in) / out, ((i + 1) * in + out - 1) / out};
}

}  // namespace

Pool2dGeometry make_pool2d_geometry(const char* op, int64_t planes, int64_t h, int64_t w,
                                    int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                                    int64_t pw) {
  HSGD_CHECK(planes > 0 && h > 0 && w > 0, op, ": input planes and spatial size (", planes, ",", h,
             ",", w, ") must be positive");
  HSGD_CHECK(kh > 0 && kw > 0, op, ": kernel (", kh, ",", kw, ") must be positive");
  HSGD_CHECK(sh > 0 && sw > 0, op, ": stride (", sh, ",", sw, ") must be positive");
  HSGD_CHECK(ph >= 0 && pw >= 0 && 2 * ph <= kh && 2 * pw <= kw, op, ": padding (", ph, ",", pw,
             ") must be non-negative and at most half the kernel (", kh, ",", kw, ")");
  HSGD_CHECK(kh <= h + 2 * ph && kw <= w + 2 * pw, op, ": kernel (", kh, ",", kw,
             ") is larger than the padded input (", h + 2 * ph, ",", w + 2 * pw, ")");
  HSGD_CHECK(h * w <= std::numeric_limits<int32_t>::max(), op, ": plane of ", h, "x", w,
             " is too large for 32-bit argmax indices");
  Pool2dGeometry g;
  g.planes = planes, g.h = h, g.w = w;
  g.kh = kh, g.kw = kw, g.sh = sh, g.sw = sw, g.ph = ph, g.pw = pw;
  g.oh = (h + 2 * ph - kh) / sh + 1;
  g.ow = (w + 2 * pw - kw) / sw + 1;
  return g;
}

// ---- max pooling ----

void max_pool2d_forward(const float* x, const Pool2dGeometry& g, float* y, int32_t* argmax) {
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  parallel_for(0, g.planes, plane_grain(g.h * g.w), [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      const float* xp = x + p * in_plane;
      float* yp = y + p * out_plane;
      int32_t* ap = argmax + p * out_plane;
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        const Span rows = window(oy, g.sh, g.ph, g.kh, g.h);
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const Span cols = window(ox, g.sw, g.pw, g.kw, g.w);
          int64_t best_index = rows.begin * g.w + cols.begin;
          float best = xp[best_index];
          for (int64_t iy = rows.begin; iy < rows.end; ++iy) {
            const float* row = xp + iy * g.w;
            for (int64_t ix = cols.begin; ix < cols.end; ++ix) {
              const float v = row[ix];
              // A NaN wins (and the last NaN of the window is kept), as in PyTorch.
              if (v > best || std::isnan(v)) {
                best = v;
                best_index = iy * g.w + ix;
              }
            }
          }
          yp[oy * g.ow + ox] = best;
          ap[oy * g.ow + ox] = static_cast<int32_t>(best_index);
        }
      }
    }
  });
}

void max_pool2d_backward(const float* gy, const int32_t* argmax, const Pool2dGeometry& g,
                         float* gx) {
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  std::fill(gx, gx + g.planes * in_plane, 0.0f);
  parallel_for(0, g.planes, plane_grain(g.h * g.w), [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      float* gxp = gx + p * in_plane;
      const float* gyp = gy + p * out_plane;
      const int32_t* ap = argmax + p * out_plane;
      for (int64_t k = 0; k < out_plane; ++k) gxp[ap[k]] += gyp[k];
    }
  });
}

// ---- average pooling ----

void avg_pool2d_forward(const float* x, const Pool2dGeometry& g, float* y) {
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  const float scale = 1.0f / static_cast<float>(g.kh * g.kw);
  parallel_for(0, g.planes, plane_grain(g.h * g.w), [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      const float* xp = x + p * in_plane;
      float* yp = y + p * out_plane;
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        const Span rows = window(oy, g.sh, g.ph, g.kh, g.h);
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const Span cols = window(ox, g.sw, g.pw, g.kw, g.w);
          float sum = 0.0f;
          for (int64_t iy = rows.begin; iy < rows.end; ++iy) {
            const float* row = xp + iy * g.w;
            for (int64_t ix = cols.begin; ix < cols.end; ++ix) sum += row[ix];
          }
          yp[oy * g.ow + ox] = sum * scale;
        }
      }
    }
  });
}

void avg_pool2d_backward(const float* gy, const Pool2dGeometry& g, float* gx) {
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  const float scale = 1.0f / static_cast<float>(g.kh * g.kw);
  std::fill(gx, gx + g.planes * in_plane, 0.0f);
  parallel_for(0, g.planes, plane_grain(g.h * g.w), [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      float* gxp = gx + p * in_plane;
      const float* gyp = gy + p * out_plane;
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        const Span rows = window(oy, g.sh, g.ph, g.kh, g.h);
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const Span cols = window(ox, g.sw, g.pw, g.kw, g.w);
          const float share = gyp[oy * g.ow + ox] * scale;
          for (int64_t iy = rows.begin; iy < rows.end; ++iy) {
            float* row = gxp + iy * g.w;
            for (int64_t ix = cols.begin; ix < cols.end; ++ix) row[ix] += share;
          }
        }
      }
    }
  });
}

// ---- adaptive average pooling ----

void adaptive_avg_pool2d_forward(const float* x, int64_t planes, int64_t h, int64_t w, int64_t oh,
                                 int64_t ow, float* y) {
  parallel_for(0, planes, plane_grain(h * w), [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      const float* xp = x + p * h * w;
      float* yp = y + p * oh * ow;
      for (int64_t oy = 0; oy < oh; ++oy) {
        const Span rows = adaptive_window(oy, h, oh);
        for (int64_t ox = 0; ox < ow; ++ox) {
          const Span cols = adaptive_window(ox, w, ow);
          float sum = 0.0f;
          for (int64_t iy = rows.begin; iy < rows.end; ++iy) {
            const float* row = xp + iy * w;
            for (int64_t ix = cols.begin; ix < cols.end; ++ix) sum += row[ix];
          }
          const int64_t count = (rows.end - rows.begin) * (cols.end - cols.begin);
          yp[oy * ow + ox] = sum / static_cast<float>(count);
        }
      }
    }
  });
}

void adaptive_avg_pool2d_backward(const float* gy, int64_t planes, int64_t h, int64_t w, int64_t oh,
                                  int64_t ow, float* gx) {
  std::fill(gx, gx + planes * h * w, 0.0f);
  parallel_for(0, planes, plane_grain(h * w), [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      float* gxp = gx + p * h * w;
      const float* gyp = gy + p * oh * ow;
      for (int64_t oy = 0; oy < oh; ++oy) {
        const Span rows = adaptive_window(oy, h, oh);
        for (int64_t ox = 0; ox < ow; ++ox) {
          const Span cols = adaptive_window(ox, w, ow);
          const int64_t count = (rows.end - rows.begin) * (cols.end - cols.begin);
          const float share = gyp[oy * ow + ox] / static_cast<float>(count);
          for (int64_t iy = rows.begin; iy < rows.end; ++iy) {
            float* row = gxp + iy * w;
            for (int64_t ix = cols.begin; ix < cols.end; ++ix) row[ix] += share;
          }
        }
      }
    }
  });
}

}  // namespace hsgd::kernels
