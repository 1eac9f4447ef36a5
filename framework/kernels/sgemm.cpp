// hsgd's SGEMM: the cache-blocked loops and the packing of op(a) and op(b) (sgemm_blocked.h's
// layouts), split across the pool; the register-level kernels are in sgemm_avx512.cpp and
// sgemm_avx2.cpp.
//
// For one chunk of c the loops are those of BLIS:
//   1. for each block of nc columns of op(b)
//   2.   for each block of kc steps of k: pack op(b)'s (kc, nc) block into panels of nr columns
//        (the first kc block scales c by beta, later ones add to it)
//   3.     for each block of mc rows of op(a): pack op(a)'s (mc, kc) block into panels of mr rows
//   4.       macro-kernel: every (mr, nr) micro-tile of the (mc, nc) block of c
// so a packed panel of b stays in L1 while the micro-kernel walks the packed a block in L2.

#include "framework/kernels/sgemm.h"

#include <cblas.h>

#include <algorithm>
#include <memory>

#include "comm/error.h"
#include "framework/kernels/block_split.h"
#include "framework/kernels/sgemm_blocked.h"
#include "framework/parallel/parallel.h"

namespace hsgd::kernels {
namespace {

// One product, or the part of it that one chunk computes.
struct Product {
  bool trans_a, trans_b;
  int64_t m, n, k;
  float alpha;
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
  float beta;
  float* c;
  int64_t ldc;
  bool pack_a, pack_b;  // whether the blocks of op(a), op(b) are packed or read in place
};

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// ---- packing ----

// The (mc, kc) block of op(a) at (i0, p0) into panels of mr rows (sgemm_blocked.h).
void pack_a(const Product& pr, int64_t i0, int64_t p0, int64_t mc, int64_t kc, int mr, float* out) {
  for (int64_t ip = 0; ip < mc; ip += mr) {
    const int64_t rows = std::min<int64_t>(mr, mc - ip);
    float* dst = out + ip * kc;
    if (!pr.trans_a) {
      // op(a)[i][p] = a[i lda + p]: each row is contiguous along p.
      const float* src = pr.a + (i0 + ip) * pr.lda + p0;
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = src + r * pr.lda;
        for (int64_t p = 0; p < kc; ++p) dst[p * mr + r] = row[p];
      }
    } else {
      // op(a)[i][p] = a[p lda + i]: the panel's rows are contiguous for each p.
      const float* src = pr.a + p0 * pr.lda + i0 + ip;
      for (int64_t p = 0; p < kc; ++p) std::copy_n(src + p * pr.lda, rows, dst + p * mr);
    }
    if (rows < mr) {
      for (int64_t p = 0; p < kc; ++p) std::fill(dst + p * mr + rows, dst + (p + 1) * mr, 0.0f);
    }
  }
}

// The (kc, nc) block of op(b) at (p0, j0) into panels of nr columns (sgemm_blocked.h).
void pack_b(const Product& pr, int64_t p0, int64_t j0, int64_t kc, int64_t nc, int nr, float* out) {
  for (int64_t jp = 0; jp < nc; jp += nr) {
    const int64_t cols = std::min<int64_t>(nr, nc - jp);
    float* dst = out + jp * kc;
    if (!pr.trans_b) {
      // op(b)[p][j] = b[p ldb + j]: the panel's columns are contiguous for each p.
      const float* src = pr.b + p0 * pr.ldb + j0 + jp;
      for (int64_t p = 0; p < kc; ++p) std::copy_n(src + p * pr.ldb, cols, dst + p * nr);
    } else {
      // op(b)[p][j] = b[j ldb + p]: each column is contiguous along p.
      const float* src = pr.b + (j0 + jp) * pr.ldb + p0;
      for (int64_t q = 0; q < cols; ++q) {
        const float* col = src + q * pr.ldb;
        for (int64_t p = 0; p < kc; ++p) dst[p * nr + q] = col[p];
      }
    }
    if (cols < nr) {
      for (int64_t p = 0; p < kc; ++p) std::fill(dst + p * nr + cols, dst + (p + 1) * nr, 0.0f);
    }
  }
}

// ---- blocked product ----

// Floats of the packing buffers one chunk needs for an (m, n, k) product: a then b.
int64_t a_buffer_size(const detail::GemmKernel& g, int64_t m, int64_t k) {
  return std::min(g.mc, round_up(m, g.mr)) * std::min(g.kc, k);
}
int64_t b_buffer_size(const detail::GemmKernel& g, int64_t n, int64_t k) {
  return std::min(g.kc, k) * std::min(g.nc, round_up(n, g.nr));
}

// The loops of the file comment over all of pr; a_buf and b_buf hold the sizes above (when
// pr packs that operand).
void blocked_product(const detail::GemmKernel& g, const Product& pr, float* a_buf, float* b_buf) {
  for (int64_t jc = 0; jc < pr.n; jc += g.nc) {
    const int64_t nc = std::min(g.nc, pr.n - jc);
    for (int64_t pc = 0; pc < pr.k; pc += g.kc) {
      const int64_t kc = std::min(g.kc, pr.k - pc);
      const float beta = pc == 0 ? pr.beta : 1.0f;
      detail::BBlock b{b_buf, kc, g.nr};
      if (pr.pack_b) {
        pack_b(pr, pc, jc, kc, nc, g.nr, b_buf);
      } else {
        b = {pr.b + pc * pr.ldb + jc, 1, pr.ldb};
      }
      for (int64_t ic = 0; ic < pr.m; ic += g.mc) {
        const int64_t mc = std::min(g.mc, pr.m - ic);
        detail::ABlock a{a_buf, kc, 1, g.mr};
        if (pr.pack_a) {
          pack_a(pr, ic, pc, mc, kc, g.mr, a_buf);
        } else if (pr.trans_a) {
          a = {pr.a + pc * pr.lda + ic, 1, 1, pr.lda};
        } else {
          a = {pr.a + ic * pr.lda + pc, pr.lda, pr.lda, 1};
        }
        g.macro(mc, nc, kc, a, b, pr.alpha, beta, pr.c + ic * pr.ldc + jc, pr.ldc);
      }
    }
  }
}

// Rows [r0, r1) of pr's c (columns [r0, r1) when !rows), as a product of its own.
Product part(const Product& pr, bool rows, int64_t r0, int64_t r1) {
  Product out = pr;
  if (rows) {
    out.m = r1 - r0;
    out.a += pr.trans_a ? r0 : r0 * pr.lda;
    out.c += r0 * pr.ldc;
  } else {
    out.n = r1 - r0;
    out.b += pr.trans_b ? r0 * pr.ldb : r0;
    out.c += r0;
  }
  return out;
}

// Splits pr's c into chunks of whole micro-tiles across the pool. The split runs along the longer
// side of c, so every chunk repacks only the smaller operand (all of op(b) when splitting rows).
void parallel_product(const detail::GemmKernel& g, const Product& pr) {
  const bool split_rows = pr.m >= pr.n;
  const int64_t unit = split_rows ? g.mr : g.nr;
  const int64_t extent = split_rows ? pr.m : pr.n;
  const int64_t units = (extent + unit - 1) / unit;
  const double flops_per_unit = 2.0 * static_cast<double>(unit) *
                                static_cast<double>(split_rows ? pr.n : pr.m) *
                                static_cast<double>(pr.k);
  const int64_t grain = block_grain(flops_per_unit);
  const int64_t chunks = hsgd::detail::chunk_count(0, units, grain, get_num_threads());
  const int64_t a_size = pr.pack_a ? round_up(a_buffer_size(g, pr.m, pr.k), 16) : 0;
  const int64_t b_size = pr.pack_b ? round_up(b_buffer_size(g, pr.n, pr.k), 16) : 0;
  const int64_t per_chunk = a_size + b_size;
  std::unique_ptr<float[]> storage;
  float* base = nullptr;
  if (per_chunk > 0) {
    // Each chunk's buffers start on a 64-byte line.
    storage = std::make_unique_for_overwrite<float[]>(chunks * per_chunk + 16);
    base = storage.get();
    base += (16 - reinterpret_cast<uintptr_t>(base) / sizeof(float) % 16) % 16;
  }
  if (chunks == 1) {
    blocked_product(g, pr, base, base + a_size);
    return;
  }
  parallel_for(0, units, grain, [&](int64_t lo, int64_t hi) {
    float* a_buf = base + parallel_thread_index() * per_chunk;
    const Product piece = part(pr, split_rows, lo * unit, std::min(hi * unit, extent));
    blocked_product(g, piece, a_buf, a_buf + a_size);
  });
}

// Which operands to pack. op(b) stored transposed must be (the kernels load rows of op(b) as
// vectors). Otherwise reading in place beat packing on every shape measured (sgemm_bench: the GPT
// and attention products by up to 2x at k <= 512, from skipping the packing passes), except where
// the rows of a block are a multiple of 4 KiB apart: then they all fall into the same few L1 sets
// and evict each other (1024^3 ran at 55 GFLOP/s in place against 97 packed).
void choose_packing(Product& pr) {
  constexpr int64_t kAliasingStride = 1024;  // floats: 4 KiB
  pr.pack_a = pr.lda % kAliasingStride == 0;
  pr.pack_b = pr.trans_b || pr.ldb % kAliasingStride == 0;
}

// c = beta * c over the m x n entries, without reading c when beta is 0.
void scale(int64_t m, int64_t n, float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    if (beta == 0.0f) {
      std::fill_n(row, n, 0.0f);
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
  }
}

void openblas_product(const Product& pr) {
  // OpenBLAS takes hsgd's thread count when the pool first decides it.
  static const int threads_decided = get_num_threads();
  (void)threads_decided;
  cblas_sgemm(CblasRowMajor, pr.trans_a ? CblasTrans : CblasNoTrans,
              pr.trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(pr.m),
              static_cast<int>(pr.n), static_cast<int>(pr.k), pr.alpha, pr.a,
              static_cast<int>(pr.lda), pr.b, static_cast<int>(pr.ldb), pr.beta, pr.c,
              static_cast<int>(pr.ldc));
}

}  // namespace

namespace detail {

const GemmKernel& sgemm_kernel(simd::Isa isa) {
  HSGD_CHECK(isa != simd::Isa::kBaseline, "sgemm_kernel: the baseline path is OpenBLAS's");
  return isa == simd::Isa::kAvx512 ? sgemm_kernel_avx512() : sgemm_kernel_avx2();
}

}  // namespace detail

simd::Isa sgemm_isa() { return simd::conv_isa(); }

simd::Isa sgemm_path(int64_t m, int64_t n, simd::Isa isa) {
  if (isa == simd::Isa::kBaseline) return isa;
  // c narrower than half a micro-tile (a classifier's 10 outputs) leaves most of every vector
  // idle: OpenBLAS ran 128 x 10 x 64 at 44 GFLOP/s, the AVX-512 tiles at 24 (also with c
  // computed transposed, which spends the time saved on packing).
  return 2 * n < detail::sgemm_kernel(isa).nr && n < m ? simd::Isa::kBaseline : isa;
}

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
           simd::Isa isa) {
  HSGD_CHECK(simd::isa_supported(isa), "sgemm: this CPU cannot run ", simd::isa_name(isa), " code");
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {
    scale(m, n, beta, c, ldc);
    return;
  }
  Product pr{trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, true, true};
  if (sgemm_path(m, n, isa) == simd::Isa::kBaseline) {
    openblas_product(pr);
    return;
  }
  choose_packing(pr);
  parallel_product(detail::sgemm_kernel(isa), pr);
}

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, sgemm_isa());
}

}  // namespace hsgd::kernels
