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

// ---- Vec2: the same 16 lanes as two native 8-float registers ----
// GCC lowers the 64-byte Vec for AVX2 through the stack (the Winograd transforms ran 3x slower on
// AVX2 than on the baseline path), so the AVX2 code is instantiated on Vec2, whose halves are
// AVX registers. Only code compiled for AVX2 may use it.

using V8 = float __attribute__((vector_size(8 * sizeof(float))));
using Mask8 = int __attribute__((vector_size(8 * sizeof(int))));

struct Vec2 {
  V8 lo, hi;  // lanes 0-7 and 8-15
};

using V8u = float __attribute__((vector_size(8 * sizeof(float)), aligned(4), may_alias));

HSGD_INLINE void load(Vec2& v, const float* p) {
  v.lo = *reinterpret_cast<const V8u*>(p);
  v.hi = *reinterpret_cast<const V8u*>(p + 8);
}
HSGD_INLINE void store(float* p, const Vec2& v) {
  *reinterpret_cast<V8u*>(p) = v.lo;
  *reinterpret_cast<V8u*>(p + 8) = v.hi;
}
HSGD_INLINE Vec2 operator+(const Vec2& a, const Vec2& b) { return {a.lo + b.lo, a.hi + b.hi}; }
HSGD_INLINE Vec2 operator-(const Vec2& a, const Vec2& b) { return {a.lo - b.lo, a.hi - b.hi}; }
HSGD_INLINE Vec2 operator-(const Vec2& a) { return {-a.lo, -a.hi}; }

HSGD_INLINE void even_lanes(const Vec2& a, const Vec2& b, Vec2& out) {
  constexpr Mask8 kEven = {0, 2, 4, 6, 8, 10, 12, 14};
  out.lo = __builtin_shuffle(a.lo, a.hi, kEven);
  out.hi = __builtin_shuffle(b.lo, b.hi, kEven);
}

HSGD_INLINE void interleave(const Vec2& a, const Vec2& b, Vec2& low, Vec2& high) {
  constexpr Mask8 kLow = {0, 8, 1, 9, 2, 10, 3, 11};
  constexpr Mask8 kHigh = {4, 12, 5, 13, 6, 14, 7, 15};
  low.lo = __builtin_shuffle(a.lo, b.lo, kLow);
  low.hi = __builtin_shuffle(a.lo, b.lo, kHigh);
  high.lo = __builtin_shuffle(a.hi, b.hi, kLow);
  high.hi = __builtin_shuffle(a.hi, b.hi, kHigh);
}

}  // namespace hsgd::kernels::simd
