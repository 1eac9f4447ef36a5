#include "framework/kernels/conv_winograd.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "comm/error.h"
#include "framework/kernels/block_split.h"
#include "framework/kernels/conv_gemm.h"
#include "framework/kernels/conv_simd.h"
#include "framework/parallel/parallel.h"

namespace hsgd::kernels {
namespace {

using simd::kLanes;
using simd::load;
using simd::Mask;
using simd::store;
using simd::Vec;

// ---- 1-D transforms ----
// Each maps in[0], in[is], ... to out[0], out[os], ...; T is float (weights) or Vec (tiles).
// The 2-D transform X -> F X F^T applies one to every row, then to every column (apply_2d).

// F(2,3): alpha = 4.
struct F2 {
  static constexpr int kM = 2, kAlpha = 4;
  template <typename T>  // B^T d
  HSGD_INLINE static void input(const T* d, int is, T* o, int os) {
    const T d0 = d[0], d1 = d[is], d2 = d[2 * is], d3 = d[3 * is];
    o[0] = d0 - d2, o[os] = d1 + d2, o[2 * os] = d2 - d1, o[3 * os] = d1 - d3;
  }
  template <typename T>  // A^T m
  HSGD_INLINE static void output(const T* m, int is, T* o, int os) {
    const T m1 = m[is], m2 = m[2 * is];
    o[0] = m[0] + m1 + m2, o[os] = m1 - m2 - m[3 * is];
  }
  template <typename T>  // A g, the adjoint of output
  HSGD_INLINE static void grad_output(const T* g, int is, T* o, int os) {
    const T g0 = g[0], g1 = g[is];
    o[0] = g0, o[os] = g0 + g1, o[2 * os] = g0 - g1, o[3 * os] = -g1;
  }
  template <typename T>  // G g
  HSGD_INLINE static void weight(const T* g, int is, T* o, int os) {
    const T g0 = g[0], g1 = g[is], g2 = g[2 * is];
    o[0] = g0, o[os] = 0.5f * (g0 + g1 + g2), o[2 * os] = 0.5f * (g0 - g1 + g2), o[3 * os] = g2;
  }
  template <typename T>  // G^T u, the adjoint of weight
  HSGD_INLINE static void grad_weight(const T* u, int is, T* o, int os) {
    const T u1 = u[is], u2 = u[2 * is];
    o[0] = u[0] + 0.5f * (u1 + u2), o[os] = 0.5f * (u1 - u2),
    o[2 * os] = 0.5f * (u1 + u2) + u[3 * is];
  }
};

enum class Stage { kInput, kOutput, kGradOutput, kWeight, kGradWeight };

template <typename W, Stage S, typename T>
HSGD_INLINE void transform_1d(const T* in, int is, T* out, int os) {
  if constexpr (S == Stage::kInput) W::input(in, is, out, os);
  if constexpr (S == Stage::kOutput) W::output(in, is, out, os);
  if constexpr (S == Stage::kGradOutput) W::grad_output(in, is, out, os);
  if constexpr (S == Stage::kWeight) W::weight(in, is, out, os);
  if constexpr (S == Stage::kGradWeight) W::grad_weight(in, is, out, os);
}

// out (kOut, kOut) = F in F^T for in (kIn, kIn), F the 1-D transform of stage S.
template <typename W, Stage S, int kIn, int kOut, typename T>
HSGD_INLINE void apply_2d(const T* in, T* out) {
  T rows[kIn * kOut];  // rows[i][q]: row i of in transformed
  for (int i = 0; i < kIn; ++i) transform_1d<W, S>(in + i * kIn, 1, rows + i * kOut, 1);
  for (int q = 0; q < kOut; ++q) transform_1d<W, S>(rows + q, kOut, out + q, kOut);
}

// ---- tile transforms ----
// Tiles are numbered over (sample, tile row, tile column); tile (ty, tx) covers output pixels
// [ty*m, ty*m+m) x [tx*m, tx*m+m) and reads the input patch whose corner is (ty*m-1, tx*m-1)
// (padding 1). A block is whole samples [n0, n0+nb); its transformed buffers are
// (alpha^2, channels, ld), one row per (transform position, channel), ld >= nb*tiles + kLanes.
//
// A transform handles one (sample, channel) plane at a time, in two steps. First the patch
// entry (i,j) of every tile is collected into a stage row, stage[i*k+j][tile], reading every
// other element of a zero-padded copy of an input row with vector shuffles (a scalar gather of
// the patches cost more than the gemm); where a vector's tiles (16, or 8 on AVX2) are one or two
// tile rows, collect_direct does the same straight into registers. Then a vector of tiles at a
// time is transformed in SIMD lanes.
// Vector stores may run up to kLanes - 1 floats past the tiles they are meant for; such spills
// land in entries that are written later or never read, which is what the slack in ld and in
// the stage rows is for.

struct TileGrid {
  int64_t h = 0, w = 0;    // plane size (input and output alike)
  int64_t th = 0, tw = 0;  // tiles per column and per row
  int64_t per_sample() const { return th * tw; }
};

struct PaddedPlanes;
struct StageRows;

// One transform call. pad and stage are scratch made once per conv by the driver: allocating
// them per block of samples cost page faults in every call.
struct TransformArgs {
  PaddedPlanes* pad = nullptr;  // kInput and kGradOutput
  StageRows* stage = nullptr;
  const float* src = nullptr;
  float* dst = nullptr;
  int64_t channels = 0;
  TileGrid grid;
  int64_t n0 = 0, nb = 0, ld = 0;  // samples [n0, n0+nb) of src (or dst for kOutput)
  simd::Isa isa = simd::Isa::kBaseline;
};

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// out[l] = row[2*l] for l < L, the lanes of V; reads row[0, 2*L). V is Vec or V8 (conv_simd.h).
template <typename V>
HSGD_INLINE void every_other(const float* row, V& out) {
  V a, b;
  load(a, row);
  load(b, row + simd::lanes_of<V>);
  simd::even_lanes(a, b, out);
}

// A sample's planes copied with zero borders, so that collect reads whole vectors without
// bounds checks: plane c, row r, column q holds x[c][r - shift][q - shift] or zero. The rows
// run past the plane by what every_other reads beyond the last tile. The copy is made for all
// channels before any is read back, so the vector loads do not wait on the stores.
struct PaddedPlanes {
  int64_t rows, row_len, plane;
  AlignedFloats data;
  PaddedPlanes(const TileGrid& g, int64_t channels, int m, int k) {
    rows = g.th * m + k;
    row_len = round_up((g.tw + kLanes) * m + k, kLanes);
    plane = rows * row_len;
    data = make_aligned_floats(channels * plane);
    std::fill(data.get(), data.get() + channels * plane, 0.0f);  // the borders stay zero
  }
  // Inlined into each ISA's transform, where the row copies compile to that ISA's vectors: a
  // memcpy call per row (8 to 32 floats) cost more than the copy itself.
  HSGD_INLINE void fill(const float* x, const TileGrid& g, int64_t channels, int64_t shift) {
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t r = 0; r < g.h; ++r) {
        const float* __restrict src = x + (c * g.h + r) * g.w;
        float* __restrict dst = data.get() + c * plane + (r + shift) * row_len + shift;
        for (int64_t q = 0; q < g.w; ++q) dst[q] = src[q];
      }
    }
  }
};

// stage[(i*k+j)*stage_ld + ty*tw + tx] = padded[ty*m + i][tx*m + j] for the k x k patch of
// every tile of one padded plane.
template <typename V, int m, int k>
HSGD_INLINE void collect(const float* padded, int64_t row_len, const TileGrid& g, float* stage,
                         int64_t stage_ld) {
  static_assert(m == 2, "every_other reads the tiles of 2x2 outputs");
  for (int64_t ty = 0; ty < g.th; ++ty) {
    for (int i = 0; i < k; ++i) {
      const float* row = padded + (ty * m + i) * row_len;
      for (int64_t tx = 0; tx < g.tw; tx += simd::lanes_of<V>) {
        for (int j = 0; j < k; ++j) {
          V v;
          every_other(row + tx * m + j, v);
          store(stage + (i * k + j) * stage_ld + ty * g.tw + tx, v);
        }
      }
    }
  }
}

// Stage rows of one plane: (alpha^2, stage_ld).
struct StageRows {
  int64_t ld;
  AlignedFloats data;
  StageRows(const TileGrid& g, int alpha)
      : ld(g.per_sample() + 2 * kLanes), data(make_aligned_floats(alpha * alpha * ld)) {}
};

// Whether collect_direct applies: the L tiles of a vector of V are one tile row (a multiple of
// L tiles per row) or two (L/2 tiles per row). Other maps go through collect and the stage rows.
template <typename V>
bool collects_directly(const TileGrid& g) {
  constexpr int kL = simd::lanes_of<V>;
  return g.tw % kL == 0 || g.tw == kL / 2;
}

// The k x k patches of L tiles of one padded plane straight into registers, patch[i*k+j][lane],
// skipping the stage rows. first is the patch corner of the vector's first tile; the second half
// of the lanes reads the tiles at first + second (see direct_second). Requires
// collects_directly<V>(g) and m == 2.
template <typename V, int k>
HSGD_INLINE void collect_direct(const float* first, int64_t row_len, int64_t second, V* patch) {
  for (int i = 0; i < k; ++i) {
    const float* row = first + i * row_len;
    for (int j = 0; j < k; ++j) {
      V a, b;
      load(a, row + j);
      load(b, row + second + j);
      simd::even_lanes(a, b, patch[i * k + j]);
    }
  }
}

// Where the second half of a vector's tiles starts, from the first tile's patch corner: L/2
// tiles further along the row (L floats at m == 2), or the next tile row when a row has L/2
// tiles.
template <typename V>
int64_t direct_second(const TileGrid& g, int64_t row_len) {
  constexpr int kL = simd::lanes_of<V>;
  return g.tw == kL / 2 ? 2 * row_len : kL;
}

// V = B^T d B: src is x (N,C,H,W), dst V (alpha^2, C, ld).
template <typename W, typename V>
HSGD_INLINE void input_transform(const TransformArgs& a) {
  constexpr int kA = W::kAlpha, kM = W::kM;
  static_assert(kM == 2, "collect_direct reads 2x2 tiles");
  const TileGrid& g = a.grid;
  const int64_t tiles = g.per_sample(), cld = a.channels * a.ld;
  const bool direct = collects_directly<V>(g);
  PaddedPlanes& pad = *a.pad;
  StageRows& s = *a.stage;
  for (int64_t n = 0; n < a.nb; ++n) {
    pad.fill(a.src + (a.n0 + n) * a.channels * g.h * g.w, g, a.channels, 1);
    for (int64_t c = 0; c < a.channels; ++c) {
      const float* plane = pad.data.get() + c * pad.plane;
      if (!direct) collect<V, kM, kA>(plane, pad.row_len, g, s.data.get(), s.ld);
      float* out = a.dst + c * a.ld + n * tiles;
      const int64_t second = direct_second<V>(g, pad.row_len);
      int64_t ty = 0, tx = 0;  // the vector's first tile, kept without dividing
      for (int64_t t = 0; t < tiles; t += simd::lanes_of<V>) {
        V d[kA * kA], v[kA * kA];
        if (direct) {
          collect_direct<V, kA>(plane + ty * kM * pad.row_len + tx * kM, pad.row_len, second, d);
          for (tx += simd::lanes_of<V>; tx >= g.tw; tx -= g.tw) ++ty;
        } else {
          for (int p = 0; p < kA * kA; ++p) load(d[p], s.data.get() + p * s.ld + t);
        }
        apply_2d<W, Stage::kInput, kA, kA>(d, v);
        for (int p = 0; p < kA * kA; ++p) store(out + p * cld + t, v[p]);
      }
    }
  }
}

// dM = A gy A^T: src is gy (N,K,H,W), dst dM (alpha^2, K, ld).
template <typename W, typename V>
HSGD_INLINE void grad_output_transform(const TransformArgs& a) {
  constexpr int kA = W::kAlpha, kM = W::kM;
  const TileGrid& g = a.grid;
  const int64_t tiles = g.per_sample(), cld = a.channels * a.ld;
  PaddedPlanes& pad = *a.pad;
  StageRows& s = *a.stage;
  for (int64_t n = 0; n < a.nb; ++n) {
    pad.fill(a.src + (a.n0 + n) * a.channels * g.h * g.w, g, a.channels, 0);
    for (int64_t c = 0; c < a.channels; ++c) {
      collect<V, kM, kM>(pad.data.get() + c * pad.plane, pad.row_len, g, s.data.get(), s.ld);
      float* out = a.dst + c * a.ld + n * tiles;
      for (int64_t t = 0; t < tiles; t += simd::lanes_of<V>) {
        V d[kM * kM], v[kA * kA];
        for (int p = 0; p < kM * kM; ++p) load(d[p], s.data.get() + p * s.ld + t);
        apply_2d<W, Stage::kGradOutput, kM, kA>(d, v);
        for (int p = 0; p < kA * kA; ++p) store(out + p * cld + t, v[p]);
      }
    }
  }
}

// dst[2*l + j] = src[j*ld + l] for l < L, j < 2: one output row from the stage rows of its two
// tile columns.
template <typename V>
HSGD_INLINE void interleave_pair(const float* src, int64_t ld, float* dst) {
  V a, b, low, high;
  load(a, src);
  load(b, src + ld);
  simd::interleave(a, b, low, high);
  store(dst, low);
  store(dst + simd::lanes_of<V>, high);
}

// y = A^T M A: src is M (alpha^2, K, ld), dst y (N,K,H,W); pixels past the plane are dropped.
template <typename W, typename V>
HSGD_INLINE void output_transform(const TransformArgs& a) {
  constexpr int kA = W::kAlpha, kM = W::kM;
  static_assert(kM == 2, "interleave_pair writes 2x2 tiles");
  const TileGrid& g = a.grid;
  const int64_t tiles = g.per_sample(), cld = a.channels * a.ld;
  const int64_t full = g.w / kM;  // tiles per row that lie wholly inside the plane
  StageRows& s = *a.stage;
  for (int64_t n = 0; n < a.nb; ++n) {
    for (int64_t c = 0; c < a.channels; ++c) {
      const float* in = a.src + c * a.ld + n * tiles;
      for (int64_t t = 0; t < tiles; t += simd::lanes_of<V>) {
        V mv[kA * kA], y[kM * kM];
        for (int p = 0; p < kA * kA; ++p) load(mv[p], in + p * cld + t);
        apply_2d<W, Stage::kOutput, kA, kM>(mv, y);
        for (int p = 0; p < kM * kM; ++p) store(s.data.get() + p * s.ld + t, y[p]);
      }
      float* out = a.dst + ((a.n0 + n) * a.channels + c) * g.h * g.w;
      for (int64_t oy = 0; oy < g.h; ++oy) {
        // src[j][tx] = y[oy][tx*m + j]
        const float* src = s.data.get() + (oy % kM) * kM * s.ld + (oy / kM) * g.tw;
        float* __restrict dst = out + oy * g.w;
        int64_t tx = 0;
        // Whole vectors of tiles interleave with two shuffles (32x32 and wider maps).
        constexpr int kL = simd::lanes_of<V>;
        for (; tx + kL <= full; tx += kL) interleave_pair<V>(src + tx, s.ld, dst + tx * kM);
        for (; tx < full; ++tx) {
          for (int j = 0; j < kM; ++j) dst[tx * kM + j] = src[j * s.ld + tx];
        }
        for (int64_t ox = full * kM; ox < g.w; ++ox) dst[ox] = src[(ox % kM) * s.ld + ox / kM];
      }
    }
  }
}

// ---- run-time dispatch ----
// Each transform is compiled for AVX-512 and for the x86-64 baseline on Vec, and for AVX2 + FMA
// on V8 (one AVX register, 8 tiles per vector); the widest one the CPU supports runs (see
// conv_simd.h).

template <typename W, Stage S, typename V>
HSGD_INLINE void run_stage(const TransformArgs& a) {
  if constexpr (S == Stage::kInput) input_transform<W, V>(a);
  if constexpr (S == Stage::kOutput) output_transform<W, V>(a);
  if constexpr (S == Stage::kGradOutput) grad_output_transform<W, V>(a);
}

template <typename W, Stage S>
__attribute__((target("avx512f,avx2,fma"))) void run_avx512(const TransformArgs& a) {
  run_stage<W, S, Vec>(a);
}
template <typename W, Stage S>
__attribute__((target("avx2,fma"))) void run_avx2(const TransformArgs& a) {
  run_stage<W, S, simd::V8>(a);
}
template <typename W, Stage S>
void run_baseline(const TransformArgs& a) {
  run_stage<W, S, Vec>(a);
}

template <typename W, Stage S>
void run(const TransformArgs& a) {
  switch (a.isa) {
    case simd::Isa::kAvx512:
      return run_avx512<W, S>(a);
    case simd::Isa::kAvx2:
      return run_avx2<W, S>(a);
    case simd::Isa::kBaseline:
      return run_baseline<W, S>(a);
  }
}

// ---- weights ----

// Output channels per chunk of the weight transforms: at least 128 (output, input) channel
// pairs, about 10 us. They ran on the calling thread alone, about 3% of its time in a 2-thread
// ResNet-20 step at batch 32.
int64_t weight_grain(int64_t c) { return std::max<int64_t>(1, 128 / std::max<int64_t>(1, c)); }

// u (alpha^2, O, C) = G w G^T for w (O, C, 3, 3).
template <typename W>
void transform_weights(const float* w, int64_t o, int64_t c, float* u) {
  constexpr int kA = W::kAlpha;
  parallel_for(0, o, weight_grain(c), [&](int64_t lo, int64_t hi) {
    for (int64_t oc = lo; oc < hi; ++oc) {
      for (int64_t ic = 0; ic < c; ++ic) {
        float t[kA * kA];
        apply_2d<W, Stage::kWeight, 3, kA>(w + (oc * c + ic) * 9, t);
        for (int p = 0; p < kA * kA; ++p) u[(p * o + oc) * c + ic] = t[p];
      }
    }
  });
}

// gw (O, C, 3, 3) = G^T du G for du (alpha^2, O, C).
template <typename W>
void grad_weights(const float* du, int64_t o, int64_t c, float* gw) {
  constexpr int kA = W::kAlpha;
  parallel_for(0, o, weight_grain(c), [&](int64_t lo, int64_t hi) {
    for (int64_t oc = lo; oc < hi; ++oc) {
      for (int64_t ic = 0; ic < c; ++ic) {
        float t[kA * kA];
        for (int p = 0; p < kA * kA; ++p) t[p] = du[(p * o + oc) * c + ic];
        apply_2d<W, Stage::kGradWeight, kA, 3>(t, gw + (oc * c + ic) * 9);
      }
    }
  });
}

// ---- blocked drivers ----

// Transformed data of a tile block (V and M for both channel counts) is kept under this many
// floats so that it stays in L2; smaller blocks mean more, smaller gemm calls.
constexpr int64_t kBlockFloats = int64_t{128} << 10;  // 512 KiB
// The weight gradient's blocks are larger: each block ends in a horizontal reduction per entry
// of du (see conv_gemm_nt), and its kernel streams v from L2 anyway.
constexpr int64_t kGradBlockFloats = int64_t{256} << 10;  // 1 MiB

TileGrid make_grid(const Conv2dGeometry& g, int m) {
  return {.h = g.h, .w = g.w, .th = (g.h + m - 1) / m, .tw = (g.w + m - 1) / m};
}

// Samples per block: enough for the transformed data to fill kBlockFloats, at least one.
int64_t samples_per_block(const Conv2dGeometry& g, const TileGrid& grid, int alpha,
                          int64_t floats = kBlockFloats) {
  const int64_t per_sample = int64_t{alpha} * alpha * (g.c + g.o) * grid.per_sample();
  return std::clamp<int64_t>(floats / per_sample, 1, g.n);
}

// Blocks of samples are independent, so the pool's threads claim whole blocks in turn
// (parallel_for_dynamic), each thread with its own transform buffers. The forward blocks shrink so
// that every thread gets one (an output does not depend on its block); the weight gradient's
// blocks do not, so that its sum over blocks, taken in block order, is the same at every thread
// count and whichever thread computed each block.

// y (N,K,H,W) = conv of x (N,C,H,W) with weights already transformed, u (alpha^2, K, C).
template <typename W>
void forward_transformed(const float* x, const float* u, const Conv2dGeometry& g, int64_t c,
                         int64_t k, float* y, simd::Isa isa) {
  constexpr int kA2 = W::kAlpha * W::kAlpha;
  const TileGrid grid = make_grid(g, W::kM);
  const int64_t threads = get_num_threads();
  const int64_t block =
      std::min(samples_per_block(g, grid, W::kAlpha), (g.n + threads - 1) / threads);
  const int64_t blocks = (g.n + block - 1) / block;
  const int64_t ld = round_up(block * grid.per_sample() + kLanes, kLanes);
  struct Scratch {
    AlignedFloats v, m;  // (alpha^2, C, ld) and (alpha^2, K, ld)
    PaddedPlanes pad;
    StageRows stage;
  };
  const int64_t grain = block_grain(2.0 * kA2 * c * k * block * grid.per_sample());
  ChunkScratch<Scratch> scratch(blocks, grain, [&] {
    return Scratch{make_aligned_floats(kA2 * c * ld), make_aligned_floats(kA2 * k * ld),
                   PaddedPlanes(grid, c, W::kM, W::kAlpha), StageRows(grid, W::kAlpha)};
  });
  parallel_for_dynamic(0, blocks, grain, [&](int64_t first, int64_t last) {
    Scratch& own = scratch.at(parallel_thread_index());
    auto& v = own.v;
    auto& m = own.m;
    PaddedPlanes& pad = own.pad;
    StageRows& stage = own.stage;
    for (int64_t b = first; b < last; ++b) {
      const int64_t n0 = b * block;
      const int64_t nb = std::min(block, g.n - n0), count = nb * grid.per_sample();
      run<W, Stage::kInput>({.pad = &pad,
                             .stage = &stage,
                             .src = x,
                             .dst = v.get(),
                             .channels = c,
                             .grid = grid,
                             .n0 = n0,
                             .nb = nb,
                             .ld = ld,
                             .isa = isa});
      for (int p = 0; p < kA2; ++p) {
        // m[p] (K, count) = u[p] (K, C) * v[p] (C, count)
        conv_gemm_nn(k, count, c, u + p * k * c, c, v.get() + p * c * ld, ld, m.get() + p * k * ld,
                     ld, isa);
      }
      run<W, Stage::kOutput>({.stage = &stage,
                              .src = m.get(),
                              .dst = y,
                              .channels = k,
                              .grid = grid,
                              .n0 = n0,
                              .nb = nb,
                              .ld = ld,
                              .isa = isa});
    }
  });
}

template <typename W>
void forward(const float* x, const float* w, const Conv2dGeometry& g, float* y, simd::Isa isa) {
  constexpr int kA2 = W::kAlpha * W::kAlpha;
  auto u = std::make_unique_for_overwrite<float[]>(kA2 * g.o * g.c);
  transform_weights<W>(w, g.o, g.c, u.get());
  forward_transformed<W>(x, u.get(), g, g.c, g.o, y, isa);
}

template <typename W>
void backward(const float* x, const float* w, const float* gy, const Conv2dGeometry& g, float* gx,
              float* gw, simd::Isa isa) {
  constexpr int kA2 = W::kAlpha * W::kAlpha;
  const TileGrid grid = make_grid(g, W::kM);
  if (gx != nullptr) {
    // gx is the convolution of gy with flipped[c, o, i, j] = w[o, c, 2-i, 2-j], padding 1.
    auto flipped = std::make_unique_for_overwrite<float[]>(g.c * g.o * 9);
    for (int64_t oc = 0; oc < g.o; ++oc) {
      for (int64_t ic = 0; ic < g.c; ++ic) {
        for (int k = 0; k < 9; ++k)
          flipped[(ic * g.o + oc) * 9 + k] = w[(oc * g.c + ic) * 9 + 8 - k];
      }
    }
    auto u = std::make_unique_for_overwrite<float[]>(kA2 * g.c * g.o);
    transform_weights<W>(flipped.get(), g.c, g.o, u.get());
    forward_transformed<W>(gy, u.get(), g, g.o, g.c, gx, isa);
  }
  if (gw == nullptr) return;
  // At least kGradBlocks blocks when that leaves each at least kMinGradTiles tiles (the length of
  // its products), so that small maps still give every thread work; the count depends on the
  // batch only, never on the thread count.
  constexpr int64_t kGradBlocks = 4, kMinGradTiles = 256;
  const int64_t min_samples = (kMinGradTiles + grid.per_sample() - 1) / grid.per_sample();
  const int64_t block =
      std::clamp<int64_t>(std::min(samples_per_block(g, grid, W::kAlpha, kGradBlockFloats),
                                   (g.n + kGradBlocks - 1) / kGradBlocks),
                          std::min(min_samples, g.n), g.n);
  const int64_t blocks = (g.n + block - 1) / block;
  const int64_t ld = round_up(block * grid.per_sample() + kLanes, kLanes);
  const int64_t du_size = kA2 * g.o * g.c;
  // du_parts[b] (alpha^2, O, C) is block b's share of du.
  auto du_parts = std::make_unique_for_overwrite<float[]>(blocks * du_size);
  struct Scratch {
    AlignedFloats v, dm;  // (alpha^2, C, ld) and (alpha^2, O, ld)
    PaddedPlanes pad_x, pad_gy;
    StageRows stage;
  };
  const int64_t grain = block_grain(2.0 * kA2 * g.c * g.o * block * grid.per_sample());
  ChunkScratch<Scratch> scratch(blocks, grain, [&] {
    return Scratch{make_aligned_floats(kA2 * g.c * ld), make_aligned_floats(kA2 * g.o * ld),
                   PaddedPlanes(grid, g.c, W::kM, W::kAlpha), PaddedPlanes(grid, g.o, W::kM, W::kM),
                   StageRows(grid, W::kAlpha)};
  });
  parallel_for_dynamic(0, blocks, grain, [&](int64_t first, int64_t last) {
    Scratch& own = scratch.at(parallel_thread_index());
    auto& v = own.v;
    auto& dm = own.dm;
    PaddedPlanes& pad_x = own.pad_x;
    PaddedPlanes& pad_gy = own.pad_gy;
    StageRows& stage = own.stage;
    for (int64_t b = first; b < last; ++b) {
      const int64_t n0 = b * block;
      const int64_t nb = std::min(block, g.n - n0), count = nb * grid.per_sample();
      run<W, Stage::kInput>({.pad = &pad_x,
                             .stage = &stage,
                             .src = x,
                             .dst = v.get(),
                             .channels = g.c,
                             .grid = grid,
                             .n0 = n0,
                             .nb = nb,
                             .ld = ld,
                             .isa = isa});
      run<W, Stage::kGradOutput>({.pad = &pad_gy,
                                  .stage = &stage,
                                  .src = gy,
                                  .dst = dm.get(),
                                  .channels = g.o,
                                  .grid = grid,
                                  .n0 = n0,
                                  .nb = nb,
                                  .ld = ld,
                                  .isa = isa});
      float* du_b = du_parts.get() + b * du_size;
      for (int p = 0; p < kA2; ++p) {
        // du_b[p] (O, C) = dm[p] (O, count) * v[p]^T (count, C)
        conv_gemm_nt(g.o, g.c, count, dm.get() + p * g.o * ld, ld, v.get() + p * g.c * ld, ld, 0.0f,
                     du_b + p * g.o * g.c, g.c, isa);
      }
    }
  });
  auto du = std::make_unique_for_overwrite<float[]>(du_size);  // (alpha^2, O, C)
  sum_in_order(du_parts.get(), blocks, du_size, du.get());
  grad_weights<W>(du.get(), g.o, g.c, gw);
}

}  // namespace

bool winograd_applies(const Conv2dGeometry& g) {
  return g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.ph == 1 && g.pw == 1;
}

void winograd_conv2d_forward(const float* x, const float* w, const Conv2dGeometry& g, float* y,
                             simd::Isa isa) {
  HSGD_CHECK(winograd_applies(g), "winograd: needs a 3x3 kernel, stride 1 and padding 1, got (",
             g.kh, ",", g.kw, ") stride (", g.sh, ",", g.sw, ") padding (", g.ph, ",", g.pw, ")");
  HSGD_CHECK(simd::isa_supported(isa), "winograd: this CPU cannot run ", simd::isa_name(isa),
             " code");
  forward<F2>(x, w, g, y, isa);
}

void winograd_conv2d_backward(const float* x, const float* w, const float* gy,
                              const Conv2dGeometry& g, float* gx, float* gw, simd::Isa isa) {
  HSGD_CHECK(winograd_applies(g), "winograd: needs a 3x3 kernel, stride 1 and padding 1, got (",
             g.kh, ",", g.kw, ") stride (", g.sh, ",", g.sw, ") padding (", g.ph, ",", g.pw, ")");
  HSGD_CHECK(simd::isa_supported(isa), "winograd: this CPU cannot run ", simd::isa_name(isa),
             " code");
  backward<F2>(x, w, gy, g, gx, gw, isa);
}

}  // namespace hsgd::kernels
