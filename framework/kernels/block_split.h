#pragma once
// Helpers of kernels that split blocks across framework/parallel's pool: the grain of such a split,
// scratch for each chunk, and per-block partial results added in block order, so that a kernel
// whose blocks run on any number of threads still rounds the same way.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/error.h"
#include "framework/parallel/parallel.h"
#include "framework/tensor/block_cache.h"

namespace hsgd::kernels {

// The grain of a parallel_for over blocks that each cost flops_per_block multiply-adds x 2: so
// many blocks that a chunk is worth waking a thread for (about 50 us of work). Small convs (the
// gradient checks' thousands of tiny calls) then stay on the calling thread.
inline int64_t block_grain(double flops_per_block) {
  constexpr double kMinChunkFlops = 2e6;
  return std::max<int64_t>(1,
                           static_cast<int64_t>(kMinChunkFlops / std::max(1.0, flops_per_block)));
}

// A float buffer from the tensors' block cache (framework/tensor/block_cache.h): aligned to a
// cache line, so that the kernels' 64-byte vector loads and stores at multiples of 16 floats do
// not straddle two lines (glibc's new[] aligns to 16 bytes only), and taken again step after step
// by the same request sizes, where aligned heap allocations fragmented the heap and raised the
// peak resident memory of a ResNet-20 step by about 5%.
struct AlignedFloatsDelete {
  size_t bytes = 0;
  void operator()(float* p) const noexcept { hsgd::detail::free_block(p, bytes); }
};
using AlignedFloats = std::unique_ptr<float[], AlignedFloatsDelete>;

// count floats, uninitialised.
inline AlignedFloats make_aligned_floats(int64_t count) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(1, count)) * sizeof(float);
  return AlignedFloats(static_cast<float*>(hsgd::detail::allocate_block(bytes)),
                       AlignedFloatsDelete{bytes});
}

// One scratch object per chunk of parallel_for(0, blocks, grain, ...) (or per thread of
// parallel_for_dynamic with the same arguments), all made by the calling thread before the split.
// Buffers allocated inside the chunks would come from each pool thread's own malloc arena, where
// freed memory is kept apart: that raised the peak resident memory of a 2-thread ResNet-20 step by
// about 20%. A chunk takes its object with at(parallel_thread_index()).
template <typename Scratch>
class ChunkScratch {
 public:
  template <typename Make>
  ChunkScratch(int64_t blocks, int64_t grain, Make make) {
    const int64_t chunks = detail::chunk_count(0, blocks, grain, get_num_threads());
    for (int64_t i = 0; i < chunks; ++i) items_.push_back(make());
  }
  Scratch& at(int index) {
    HSGD_CHECK(index >= 0 && index < static_cast<int>(items_.size()), "ChunkScratch: chunk ", index,
               " of ", items_.size());
    return items_[static_cast<size_t>(index)];
  }

 private:
  std::vector<Scratch> items_;
};

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
