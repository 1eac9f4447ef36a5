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

#include <cstdlib>
#include <cstring>
#include <string_view>

namespace hsgd::kernels::simd {

#define HSGD_INLINE [[gnu::always_inline]] inline

constexpr int kLanes = 16;
using Vec = float __attribute__((vector_size(kLanes * sizeof(float))));
using Mask = int __attribute__((vector_size(kLanes * sizeof(int))));

HSGD_INLINE void load(Vec& v, const float* p) { std::memcpy(&v, p, sizeof(Vec)); }
HSGD_INLINE void store(float* p, const Vec& v) { std::memcpy(p, &v, sizeof(Vec)); }

// Widest first: a CPU supports an Isa and every one after it.
enum class Isa { kAvx512, kAvx2, kBaseline };

// The widest instruction set the kernels may use, chosen once: the widest the running CPU
// supports, unless the environment variable HSGD_CONV_ISA names a narrower one ("avx2" or
// "baseline"), which then caps it for the whole process. The cap lets the narrower paths be
// measured and tested on a wider CPU; a value that names no Isa, or one wider than the CPU
// supports, is ignored.
inline Isa conv_isa();

// Whether code compiled for isa may run: the CPU supports it and HSGD_CONV_ISA does not exclude
// it.
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

// Defined after isa_name, whose names HSGD_CONV_ISA takes.
inline Isa conv_isa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    Isa widest = Isa::kBaseline;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) widest = Isa::kAvx2;
    if (__builtin_cpu_supports("avx512f")) widest = Isa::kAvx512;
    const char* cap = std::getenv("HSGD_CONV_ISA");
    if (cap == nullptr) return widest;
    for (Isa named : {Isa::kAvx512, Isa::kAvx2, Isa::kBaseline}) {
      if (std::string_view(cap) == isa_name(named) &&
          static_cast<int>(named) > static_cast<int>(widest)) {
        return named;
      }
    }
    return widest;
  }();
  return isa;
}

// ---- lane moves on Vec ----

// out[l] = (a, b)[2 l]: the even lanes of a followed by those of b.
HSGD_INLINE void even_lanes(const Vec& a, const Vec& b, Vec& out) {
  constexpr Mask kEven = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  out = __builtin_shuffle(a, b, kEven);
}

// low = (a0, b0, a1, b1, ..., a7, b7), high = (a8, b8, ..., a15, b15).
HSGD_INLINE void interleave(const Vec& a, const Vec& b, Vec& low, Vec& high) {
  constexpr Mask kLow = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
  constexpr Mask kHigh = {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  low = __builtin_shuffle(a, b, kLow);
  high = __builtin_shuffle(a, b, kHigh);
}

// ---- V8: one native AVX register of 8 floats ----
// GCC lowers the 64-byte Vec for AVX2 through the stack (the Winograd transforms ran 3x slower on
// AVX2 than on the baseline path), so the AVX2 code is instantiated on V8, 8 lanes per vector.
// (A pair of V8 as one 16-lane vector needed twice the registers: a 4x4 tile transform spilled.)
// Only code compiled for AVX2 may use it.

using V8 = float __attribute__((vector_size(8 * sizeof(float))));
using Mask8 = int __attribute__((vector_size(8 * sizeof(int))));
using V8u = float __attribute__((vector_size(8 * sizeof(float)), aligned(4), may_alias));

// Lanes per vector of V: kLanes for Vec, 8 for V8.
template <typename V>
inline constexpr int lanes_of = kLanes;
template <>
inline constexpr int lanes_of<V8> = 8;

// Whole 32-byte accesses (memcpy made GCC copy arrays of vectors in 16-byte pieces and read them
// back as 32 bytes, a store-forwarding stall).
HSGD_INLINE void load(V8& v, const float* p) { v = *reinterpret_cast<const V8u*>(p); }
HSGD_INLINE void store(float* p, const V8& v) { *reinterpret_cast<V8u*>(p) = v; }

HSGD_INLINE void even_lanes(const V8& a, const V8& b, V8& out) {
  constexpr Mask8 kEven = {0, 2, 4, 6, 8, 10, 12, 14};
  out = __builtin_shuffle(a, b, kEven);
}

HSGD_INLINE void interleave(const V8& a, const V8& b, V8& low, V8& high) {
  constexpr Mask8 kLow = {0, 8, 1, 9, 2, 10, 3, 11};
  constexpr Mask8 kHigh = {4, 12, 5, 13, 6, 14, 7, 15};
  low = __builtin_shuffle(a, b, kLow);
  high = __builtin_shuffle(a, b, kHigh);
}

}  // namespace hsgd::kernels::simd
