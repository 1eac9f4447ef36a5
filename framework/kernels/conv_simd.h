#pragma once
// SIMD helpers shared by the conv kernels (conv_winograd, conv_gemm): the Vec type and the choice
// of instruction set. For kernel code only.
//
// The build has no -march flags. Kernels are written once on Vec, a GCC vector of 16 floats, in
// always_inline functions (HSGD_INLINE), and instantiated in wrappers declared with
// __attribute__((target(...))); the same source then compiles to one AVX-512 register, two AVX2
// registers or four SSE2 registers per Vec. conv_isa() picks the wrapper at run time, so a CPU
// without AVX-512 never executes its instructions. Vec values only live in locals and arrays,
// never in by-value parameters, whose ABI would differ between those targets.

#include <cstring>

namespace hsgd::kernels::simd {

#define HSGD_INLINE [[gnu::always_inline]] inline

constexpr int kLanes = 16;
using Vec = float __attribute__((vector_size(kLanes * sizeof(float))));
using Mask = int __attribute__((vector_size(kLanes * sizeof(int))));

HSGD_INLINE void load(Vec& v, const float* p) { std::memcpy(&v, p, sizeof(Vec)); }
HSGD_INLINE void store(float* p, const Vec& v) { std::memcpy(p, &v, sizeof(Vec)); }

// Widest first: a CPU supports an Isa and every one after it.
enum class Isa { kAvx512, kAvx2, kBaseline };

// The widest instruction set the running CPU supports, detected once.
inline Isa conv_isa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
    return Isa::kBaseline;
  }();
  return isa;
}

// Whether the running CPU can execute code compiled for isa.
inline bool isa_supported(Isa isa) { return static_cast<int>(isa) >= static_cast<int>(conv_isa()); }

// Printable name, for messages and test labels.
inline const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kBaseline:
      return "baseline";
  }
  return "?";
}

}  // namespace hsgd::kernels::simd
