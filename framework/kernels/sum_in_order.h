#pragma once
// Helpers of kernels that split blocks across framework/parallel's pool: the grain of such a split,
// and per-block partial results added in block order, so that a kernel whose blocks run on any
// number of threads still rounds the same way.

#include <algorithm>
#include <cstdint>

#include "framework/parallel/parallel.h"

namespace hsgd::kernels {

// The grain of a parallel_for over blocks that each cost flops_per_block multiply-adds x 2: so
// many blocks that a chunk is worth waking a thread for (about 50 us of work). Small convs (the
// gradient checks' thousands of tiny calls) then stay on the calling thread.
inline int64_t block_grain(double flops_per_block) {
  constexpr double kMinChunkFlops = 2e6;
  return std::max<int64_t>(1,
                           static_cast<int64_t>(kMinChunkFlops / std::max(1.0, flops_per_block)));
}

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
