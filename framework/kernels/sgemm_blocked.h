#pragma once
// The per-instruction-set half of hsgd's own SGEMM (sgemm.h), for sgemm.cpp and the kernel files
// only. sgemm.cpp packs op(a) and op(b) into panels and walks the cache blocks; each instruction
// set contributes a macro-kernel that multiplies one packed block of op(a) by one packed block of
// op(b) into c, compiled in its own file for its own target (sgemm_avx512.cpp, sgemm_avx2.cpp), so
// that a CPU without those instructions never executes them.
//
// The macro-kernel reads op(a) and op(b) either packed or where they are (for products too small
// to repay the packing, and for operands already laid out as a packed panel would be):
//   a packed is ceil(mc/mr) panels of (kc, mr): panel i holds rows [i mr, i mr + mr) of the
//          block, column by column (entry (i mr + r, p) at i kc mr + p mr + r), zero past row mc;
//   b packed is ceil(nc/nr) panels of (kc, nr): panel j holds columns [j nr, j nr + nr), row by
//          row (entry (p, j nr + q) at j kc nr + p nr + q), zero past column nc.
// Both are described by the strides below; an operand read in place has the strides of its
// storage, with nothing beyond its entries read (edge panels of b are masked).
//
// Usage (what sgemm.cpp does for one block; not compiled: the packing of a_pack and b_pack is
// elided):
//   const detail::GemmKernel& g = detail::sgemm_kernel(simd::Isa::kAvx2);
//   // a_pack, b_pack packed as above for (mc, kc) and (kc, nc); c (mc, nc) with row stride ldc
//   g.macro(mc, nc, kc, {a_pack, kc, 1, g.mr}, {b_pack, kc, g.nr}, alpha, beta, c, ldc);

#include <cstdint>

#include "framework/kernels/conv_simd.h"

namespace hsgd::kernels::detail {

// A block of op(a): the micro-tile of rows starting at ir starts at data + ir * tile_scale, with
// its row r at + r * row and step p of k at + p * step; row or step is 1. Packed: (kc, 1, mr); in
// place, a (m,k) row-major: (lda, lda, 1); a stored transposed: (1, 1, lda).
struct ABlock {
  const float* data;
  int64_t tile_scale, row, step;
};

// A block of op(b): the panel of columns starting at jr starts at data + jr * panel_scale, with
// its column q at + q and step p of k at + p * step. Packed: (kc, nr); in place, b (k,n)
// row-major: (1, ldb).
struct BBlock {
  const float* data;
  int64_t panel_scale, step;
};

// One instruction set's micro-tile, cache blocking and macro-kernel.
struct GemmKernel {
  int mr, nr;          // micro-tile of c: mr rows by nr columns, accumulated in registers
  int64_t mc, kc, nc;  // cache blocks: mc a multiple of mr, nc of nr
  // c (mc, nc) = alpha * A B + beta * c for A (mc, kc) and B (kc, nc); c is not read when beta
  // == 0. Reads only A's and B's entries, writes only the mc x nc entries of c.
  void (*macro)(int64_t mc, int64_t nc, int64_t kc, const ABlock& a, const BBlock& b, float alpha,
                float beta, float* c, int64_t ldc);
};

// The kernel of isa (kAvx512 or kAvx2); the CPU must support isa.
const GemmKernel& sgemm_kernel(simd::Isa isa);

// Defined in sgemm_avx512.cpp and sgemm_avx2.cpp.
const GemmKernel& sgemm_kernel_avx512();
const GemmKernel& sgemm_kernel_avx2();

}  // namespace hsgd::kernels::detail
