#include "framework/kernels/conv_kernels.h"

// The forward and backward passes of a convolution: Winograd where it applies, else blocked
// gemms over unfolded samples (im2col and col2im are in conv_unfold.cpp).

#include <algorithm>
#include <cstring>
#include <memory>

#include "framework/kernels/block_split.h"
#include "framework/kernels/conv_gemm.h"
#include "framework/kernels/conv_winograd.h"
#include "framework/parallel/parallel.h"

namespace hsgd::kernels {
namespace {

// A gemm narrower than this many columns runs well below OpenBLAS's peak (16 columns: about half),
// so small output maps are unfolded several samples at a time; much wider blocks were slower
// again (the column block no longer stays in L2). The block is capped to bound the workspace.
constexpr int64_t kMinGemmColumns = 256;
constexpr int64_t kMaxColumnFloats = int64_t{4} << 20;  // 16 MiB

// Elementwise work below this many floats stays on one thread.
constexpr int64_t kGrainFloats = 16384;

// The column and wide buffers of one thread's blocks; a size of 0 leaves the buffer null.
struct BlockBuffers {
  AlignedFloats col, wide;
  BlockBuffers(int64_t col_floats, int64_t wide_floats) {
    if (col_floats > 0) col = make_aligned_floats(col_floats);
    if (wide_floats > 0) wide = make_aligned_floats(wide_floats);
  }
};

// Number of samples unfolded together. A forward pass (whose outputs do not depend on the
// blocking) passes its thread count, so that every thread gets a block; a weight gradient,
// summed over blocks, does not, so that its rounding is the same at every thread count.
int64_t samples_per_block(const Conv2dGeometry& g, int64_t threads = 1) {
  const int64_t plane = g.out_plane();
  int64_t block = (kMinGemmColumns + plane - 1) / plane;
  const int64_t by_memory = kMaxColumnFloats / std::max<int64_t>(1, g.col_rows() * plane);
  block = std::min(block, std::max<int64_t>(1, by_memory));
  block = std::min(block, (g.n + threads - 1) / threads);
  return std::clamp<int64_t>(block, 1, g.n);
}

// With stride 1 the input gradient is itself a convolution: gy, padded by k-1-p, correlated
// with the kernel flipped in both axes and with input and output channels swapped. The unfold
// of gy this needs, U (O*kh*kw, H*W), also yields the weight gradient, since
//   gw[o,c,kh-1-i,kw-1-j] = sum over samples of (x_n (C, H*W) * U_n^T)[c, (o,i,j)],
// so one im2col serves both gradients (the col2im path needs two unfolds and a scatter-add).
// Padding p >= k would need negative padding; such convs fold instead, as do convs with few
// input channels (an RGB stem), whose gx gemm would have only C rows.
constexpr int64_t kMinChannelsForTransposedConv = 16;

bool input_grad_is_conv(const Conv2dGeometry& g) {
  return g.sh == 1 && g.sw == 1 && g.ph < g.kh && g.pw < g.kw && !g.is_pointwise() &&
         g.c >= kMinChannelsForTransposedConv;
}

// Winograd pays per transformed tile and channel; with few input channels (an RGB stem) its
// products are too short to repay the transforms and the 16 product planes it writes, and the
// unfolded gemm (27 rows for 3x3 RGB) is cheaper.
constexpr int64_t kMinChannelsForWinograd = 8;

bool use_winograd(const Conv2dGeometry& g) {
  return winograd_applies(g) && g.c >= kMinChannelsForWinograd;
}

// Copies samples [n0, n0+nb) of t (N,K,plane) into wide (K, nb*plane), the layout a blocked
// gemm reads, and scatter_block copies such a result back.
void gather_block(const float* t, int64_t k, int64_t plane, int64_t n0, int64_t nb, float* wide) {
  const int64_t ld = nb * plane;
  for (int64_t s = 0; s < nb; ++s) {
    for (int64_t r = 0; r < k; ++r) {
      std::memcpy(wide + r * ld + s * plane, t + ((n0 + s) * k + r) * plane, sizeof(float) * plane);
    }
  }
}

void scatter_block(const float* wide, int64_t k, int64_t plane, int64_t n0, int64_t nb, float* t) {
  const int64_t ld = nb * plane;
  for (int64_t s = 0; s < nb; ++s) {
    for (int64_t r = 0; r < k; ++r) {
      std::memcpy(t + ((n0 + s) * k + r) * plane, wide + r * ld + s * plane, sizeof(float) * plane);
    }
  }
}

// gx (N,C,H,W) and, if gw is not null, gw (O,C,kh,kw) of a conv with input_grad_is_conv(g).
void conv2d_backward_by_transposed_conv(const float* x, const float* w, const float* gy,
                                        const Conv2dGeometry& g, float* gx, float* gw) {
  const int64_t kh = g.kh, kw = g.kw, taps = kh * kw;
  // t: the convolution of gy (N,O,OH,OW) with flipped (C,O,kh,kw) that produces gx (N,C,H,W).
  const Conv2dGeometry t =
      make_conv2d_geometry(g.n, g.o, g.oh, g.ow, g.c, kh, kw, 1, 1, kh - 1 - g.ph, kw - 1 - g.pw);
  const int64_t rows = t.col_rows(), plane = t.out_plane();  // O*kh*kw, H*W
  const int64_t gy_size = g.o * g.out_plane(), x_size = g.c * plane;

  // flipped[c, (o,i,j)] = w[o, c, kh-1-i, kw-1-j]
  auto flipped = std::make_unique_for_overwrite<float[]>(g.c * rows);
  for (int64_t oc = 0; oc < g.o; ++oc) {
    for (int64_t c = 0; c < g.c; ++c) {
      for (int64_t k = 0; k < taps; ++k) {
        flipped[c * rows + oc * taps + k] = w[(oc * g.c + c) * taps + (taps - 1 - k)];
      }
    }
  }
  const int64_t block = samples_per_block(t);
  const int64_t blocks = (g.n + block - 1) / block;
  // gw_parts[b] is block b's share of gw as (O*kh*kw, C) with flipped taps (the fast gemm shape,
  // see below); gw_t is their sum in block order.
  std::unique_ptr<float[]> gw_parts, gw_t;
  if (gw != nullptr) {
    gw_parts = std::make_unique_for_overwrite<float[]>(blocks * rows * g.c);
    gw_t = std::make_unique_for_overwrite<float[]>(rows * g.c);
  }
  // col is U for a block, (O*kh*kw, block*H*W); wide holds gx or x of a block as (C, block*H*W).
  const int64_t grain = block_grain(2.0 * g.c * rows * block * plane);
  ChunkScratch<BlockBuffers> scratch(blocks, grain, [&] {
    return BlockBuffers(rows * block * plane, block > 1 ? g.c * block * plane : 0);
  });
  parallel_for_dynamic(0, blocks, grain, [&](int64_t first, int64_t last) {
    BlockBuffers& own = scratch.at(parallel_thread_index());
    auto& col = own.col;
    auto& wide = own.wide;
    for (int64_t b = first; b < last; ++b) {
      const int64_t n0 = b * block, nb = std::min(block, g.n - n0);
      const int64_t ld = nb * plane;
      for (int64_t s = 0; s < nb; ++s) {
        im2col(gy + (n0 + s) * gy_size, t, col.get() + s * plane, ld);
      }
      // gx block (C, ld) = flipped (C, rows) * col (rows, ld)
      float* gx_out = nb == 1 ? gx + n0 * x_size : wide.get();
      conv_gemm_nn(g.c, ld, rows, flipped.get(), rows, col.get(), ld, gx_out, ld);
      if (nb > 1) scatter_block(wide.get(), g.c, plane, n0, nb, gx);
      if (gw == nullptr) continue;
      const float* x_block = x + n0 * x_size;
      if (nb > 1) {
        gather_block(x, g.c, plane, n0, nb, wide.get());
        x_block = wide.get();
      }
      // gw_parts[b] (rows, C) = col (rows, ld) * x_block^T (ld, C)
      conv_gemm_nt(rows, g.c, ld, col.get(), ld, x_block, ld, 0.0f, gw_parts.get() + b * rows * g.c,
                   g.c);
    }
  });
  if (gw != nullptr) sum_in_order(gw_parts.get(), blocks, rows * g.c, gw_t.get());
  if (gw != nullptr) {
    for (int64_t oc = 0; oc < g.o; ++oc) {
      for (int64_t c = 0; c < g.c; ++c) {
        for (int64_t k = 0; k < taps; ++k) {
          gw[(oc * g.c + c) * taps + (taps - 1 - k)] = gw_t[(oc * taps + k) * g.c + c];
        }
      }
    }
  }
}

// y (N,O,OH,OW) += b (O) broadcast; nothing when b is null.
void add_bias(const float* b, const Conv2dGeometry& g, float* y) {
  if (b == nullptr) return;
  const int64_t plane = g.out_plane();
  parallel_for(0, g.n * g.o, std::max<int64_t>(1, kGrainFloats / plane),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t so = lo; so < hi; ++so) {
                   float* p = y + so * plane;
                   const float bias = b[so % g.o];
                   for (int64_t k = 0; k < plane; ++k) p[k] += bias;
                 }
               });
}

}  // namespace

void conv2d_forward(const float* x, const float* w, const float* b, const Conv2dGeometry& g,
                    float* y) {
  if (use_winograd(g)) {
    winograd_conv2d_forward(x, w, g, y);
    add_bias(b, g, y);
    return;
  }
  const int64_t rows = g.col_rows(), plane = g.out_plane();
  const int64_t x_size = g.c * g.in_plane(), y_size = g.o * plane;
  const int64_t block = samples_per_block(g, get_num_threads());
  const bool direct = block == 1 && g.is_pointwise();
  const int64_t blocks = (g.n + block - 1) / block;
  // col is (C*kh*kw, block*OH*OW); wide is (O, block*OH*OW), the gemm result before it is
  // scattered back to (block,O,OH,OW).
  const int64_t grain = block_grain(2.0 * g.o * rows * block * plane);
  ChunkScratch<BlockBuffers> scratch(blocks, grain, [&] {
    return BlockBuffers(direct ? 0 : rows * block * plane, block > 1 ? g.o * block * plane : 0);
  });
  parallel_for_dynamic(0, blocks, grain, [&](int64_t first, int64_t last) {
    BlockBuffers& own = scratch.at(parallel_thread_index());
    auto& col = own.col;
    auto& wide = own.wide;
    for (int64_t bi = first; bi < last; ++bi) {
      const int64_t n0 = bi * block, nb = std::min(block, g.n - n0);
      const int64_t ld = nb * plane;
      const float* a = x + n0 * x_size;  // the unfolded input
      if (!direct) {
        for (int64_t s = 0; s < nb; ++s) {
          im2col(x + (n0 + s) * x_size, g, col.get() + s * plane, ld);
        }
        a = col.get();
      }
      float* out = nb == 1 ? y + n0 * y_size : wide.get();
      // out (O, ld) = w (O, rows) * a (rows, ld)
      conv_gemm_nn(g.o, ld, rows, w, rows, a, ld, out, ld);
      if (nb > 1) scatter_block(out, g.o, plane, n0, nb, y);
    }
  });
  add_bias(b, g, y);
}

void conv2d_backward(const float* x, const float* w, const float* gy, const Conv2dGeometry& g,
                     float* gx, float* gw, float* gb) {
  const int64_t rows = g.col_rows(), plane = g.out_plane();
  const int64_t x_size = g.c * g.in_plane(), y_size = g.o * plane;

  if (gb != nullptr) {
    // gb[o] = sum over samples and output positions of gy
    parallel_for(0, g.o, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t oc = lo; oc < hi; ++oc) {
        double total = 0.0;
        for (int64_t s = 0; s < g.n; ++s) {
          const float* p = gy + s * y_size + oc * plane;
          float partial = 0.0f;
          for (int64_t k = 0; k < plane; ++k) partial += p[k];
          total += partial;
        }
        gb[oc] = static_cast<float>(total);
      }
    });
  }
  if ((gx != nullptr || gw != nullptr) && use_winograd(g)) {
    winograd_conv2d_backward(x, w, gy, g, gx, gw);
    return;
  }
  if (gx != nullptr && input_grad_is_conv(g)) {
    conv2d_backward_by_transposed_conv(x, w, gy, g, gx, gw);
    return;
  }
  if (gx == nullptr && gw == nullptr) return;

  const int64_t block = samples_per_block(g);
  const int64_t blocks = (g.n + block - 1) / block;
  const bool direct = block == 1 && g.is_pointwise();
  // gw_t is gw transposed, (C*kh*kw, O): accumulating it as col * gy^T runs about twice as fast
  // in OpenBLAS as gy * col^T (long inner dimension with a tiny output), so gw is transposed once
  // at the end. gw_parts[b] is block b's share, summed in block order.
  std::unique_ptr<float[]> gw_parts, gw_t;
  if (gw != nullptr) {
    gw_parts = std::make_unique_for_overwrite<float[]>(blocks * rows * g.o);
    gw_t = std::make_unique_for_overwrite<float[]>(rows * g.o);
  }
  // w_t is w transposed, (C*kh*kw, O), the left operand of the input-gradient product.
  std::unique_ptr<float[]> w_t;
  if (gx != nullptr) {
    w_t = std::make_unique_for_overwrite<float[]>(rows * g.o);
    for (int64_t oc = 0; oc < g.o; ++oc) {
      for (int64_t r = 0; r < rows; ++r) w_t[r * g.o + oc] = w[oc * rows + r];
    }
  }

  // col is (C*kh*kw, block*OH*OW): first the unfolded input (for gw), then the unfolded input
  // gradient (for gx). wide is gy of the block laid out as (O, block*OH*OW).
  const int64_t grain = block_grain(4.0 * g.o * rows * block * plane);
  ChunkScratch<BlockBuffers> scratch(blocks, grain, [&] {
    return BlockBuffers(direct ? 0 : rows * block * plane, block > 1 ? g.o * block * plane : 0);
  });
  parallel_for_dynamic(0, blocks, grain, [&](int64_t first, int64_t last) {
    BlockBuffers& own = scratch.at(parallel_thread_index());
    auto& col = own.col;
    auto& wide = own.wide;
    for (int64_t bi = first; bi < last; ++bi) {
      const int64_t n0 = bi * block, nb = std::min(block, g.n - n0);
      const int64_t ld = nb * plane;
      const float* gy_block = gy + n0 * y_size;
      if (nb > 1) {
        gather_block(gy, g.o, plane, n0, nb, wide.get());
        gy_block = wide.get();
      }
      if (gw != nullptr) {
        const float* a = x + n0 * x_size;
        if (!direct) {
          for (int64_t s = 0; s < nb; ++s) {
            im2col(x + (n0 + s) * x_size, g, col.get() + s * plane, ld);
          }
          a = col.get();
        }
        // gw_parts[b] (rows, O) = a (rows, ld) * gy_block^T (ld, O)
        conv_gemm_nt(rows, g.o, ld, a, ld, gy_block, ld, 0.0f, gw_parts.get() + bi * rows * g.o,
                     g.o);
      }
      if (gx != nullptr) {
        float* gx_block = gx + n0 * x_size;
        if (direct) {
          // gx_n (C, H*W) = w^T (C, O) * gy_n (O, H*W)
          conv_gemm_nn(rows, ld, g.o, w_t.get(), g.o, gy_block, ld, gx_block, ld);
          continue;
        }
        // col (rows, ld) = w^T (rows, O) * gy_block (O, ld), then fold back into gx
        conv_gemm_nn(rows, ld, g.o, w_t.get(), g.o, gy_block, ld, col.get(), ld);
        std::fill(gx_block, gx_block + nb * x_size, 0.0f);
        for (int64_t s = 0; s < nb; ++s) {
          col2im(col.get() + s * plane, g, gx_block + s * x_size, ld);
        }
      }
    }
  });
  if (gw != nullptr) sum_in_order(gw_parts.get(), blocks, rows * g.o, gw_t.get());
  if (gw != nullptr) {
    for (int64_t oc = 0; oc < g.o; ++oc) {
      for (int64_t r = 0; r < rows; ++r) gw[oc * rows + r] = gw_t[r * g.o + oc];
    }
  }
}

}  // namespace hsgd::kernels
