#pragma once
// Adds per-block partial results in block order, so that a kernel whose blocks run on any number
// of threads still rounds the same way (see framework/parallel/parallel.h).

#include <algorithm>
#include <cstdint>

#include "framework/parallel/parallel.h"

namespace hsgd::kernels {

// out[i] = ((parts[0][i] + parts[1][i]) + parts[2][i]) + ... for parts (count, size), count >= 1.
// out may not overlap parts.
inline void sum_in_order(const float* parts, int64_t count, int64_t size, float* out) {
  parallel_for(0, size, 4096, [&](int64_t lo, int64_t hi) {
    std::copy(parts + lo, parts + hi, out + lo);
    for (int64_t b = 1; b < count; ++b) {
      const float* __restrict part = parts + b * size;
      for (int64_t i = lo; i < hi; ++i) out[i] += part[i];
    }
  });
}

}  // namespace hsgd::kernels
