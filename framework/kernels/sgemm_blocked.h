#pragma once
// The per-instruction-set half of hsgd's own SGEMM (sgemm.h), for sgemm.cpp and the kernel files
// only. sgemm.cpp packs op(a) and op(b) into panels and walks the cache blocks; each instruction
// set contributes a macro-kernel that multiplies one packed block of op(a) by one packed block of
// op(b) into c, compiled in its own file for its own target (sgemm_avx512.cpp, sgemm_avx2.cpp), so
// that a CPU without those instructions never executes them.
//
// Packed layouts, for a block of mc rows of op(a) and nc columns of op(b) over kc steps of k:
//   a_pack is ceil(mc/mr) panels of (kc, mr): panel i holds rows [i mr, i mr + mr) of the block,
//          column by column (a_pack[i kc mr + p mr + r] = op(a)[i mr + r][p]), zero past row mc;
//   b_pack is ceil(nc/nr) panels of (kc, nr): panel j holds columns [j nr, j nr + nr), row by row
//          (b_pack[j kc nr + p nr + q] = op(b)[p][j nr + q]), zero past column nc.
//
// Usage (what sgemm.cpp does for one block):
//   const detail::GemmKernel& g = detail::sgemm_kernel(simd::Isa::kAvx2);
//   // a_pack, b_pack as above for (mc, kc) and (kc, nc); c (mc, nc) with row stride ldc
//   g.macro(mc, nc, kc, a_pack, b_pack, alpha, beta, c, ldc);

#include <cstdint>

#include "framework/kernels/conv_simd.h"

namespace hsgd::kernels::detail {

// One instruction set's micro-tile, cache blocking and macro-kernel.
struct GemmKernel {
  int mr, nr;          // micro-tile of c: mr rows by nr columns, accumulated in registers
  int64_t mc, kc, nc;  // cache blocks: mc a multiple of mr, nc of nr
  // c (mc, nc) = alpha * A B + beta * c, A (mc, kc) and B (kc, nc) in a_pack and b_pack as above;
  // c is not read when beta == 0. Reads and writes only the mc x nc entries of c.
  void (*macro)(int64_t mc, int64_t nc, int64_t kc, const float* a_pack, const float* b_pack,
                float alpha, float beta, float* c, int64_t ldc);
};

// The kernel of isa (kAvx512 or kAvx2); the CPU must support isa.
const GemmKernel& sgemm_kernel(simd::Isa isa);

// Defined in sgemm_avx512.cpp and sgemm_avx2.cpp.
const GemmKernel& sgemm_kernel_avx512();
const GemmKernel& sgemm_kernel_avx2();

}  // namespace hsgd::kernels::detail
