#pragma once
// The memory behind every Tensor: a cache of large blocks, kept by exact size, that a training
// loop reuses step after step (as PyTorch's CUDA caching allocator does for GPU memory).
//
// Why: a training step frees and allocates the same activation and gradient blocks every step.
// Through glibc malloc either every step faults those pages in again (~250,000 minor faults in
// 30 ResNet-20 steps at batch 32; blocks above the mmap threshold are unmapped on free), or, with
// the threshold raised so that the heap keeps them, the heap fragments: a ResNet-20 step at
// batch 128 whose live tensors peak at about 200 MB grew the heap to 300-400 MB. Here a block of
// 256 KiB or more is mapped once (mmap), parked on free in a list for its size rounded up to a
// page, and handed out again for the next request of that size. A step's sizes repeat, so after
// the first step nothing is mapped and resident memory stays near the live peak.
//
// Contract:
// - Blocks are 64-byte aligned and uninitialised (reused blocks keep old contents).
// - The cache holds at most max(64 MiB, 1.5 x the highest live total seen) mapped; a request
//   beyond that unmaps idle blocks, the least recently freed first. empty_cache() unmaps all
//   idle blocks.
// - Smaller blocks come from operator new (glibc), as do all blocks when HSGD_MALLOC_DEFAULTS=1
//   or under AddressSanitizer (which would not see a use after free in a reused block).
// - Thread-safe; a forked child may allocate (the lock is held across fork).
// - One cache per process, like malloc itself: the ranks of a multi-rank test share it.
//
// Example:
//   const hsgd::MemoryStats before = hsgd::memory_stats();
//   { hsgd::Tensor t = hsgd::zeros({1024, 1024}); }            // 4 MiB: mapped, then idle
//   hsgd::Tensor again = hsgd::zeros({1024, 1024});           // the same block, not mapped
//   // memory_stats().maps - before.maps <= 1
//   hsgd::empty_cache();

#include <cstddef>
#include <cstdint>

namespace hsgd {

struct MemoryStats {
  int64_t allocated_bytes = 0;       // tensor blocks in use (torch.cuda.memory_allocated)
  int64_t reserved_bytes = 0;        // in use + idle in the cache (torch.cuda.memory_reserved)
  int64_t peak_allocated_bytes = 0;  // since the start or reset_peak_memory_stats()
  int64_t peak_reserved_bytes = 0;
  int64_t cached_blocks = 0;  // idle blocks in the cache now
  // What the cache keeps mapped at most (in use + idle blocks of 256 KiB or more): max(64 MiB,
  // 1.5 x the highest live total ever). Exceeded only when no idle block is left to unmap.
  int64_t limit_bytes = 0;
  int64_t maps = 0;    // blocks mapped from the kernel so far
  int64_t unmaps = 0;  // blocks given back so far
};

// A snapshot of the counters (all blocks, large and small).
MemoryStats memory_stats();

// Gives every idle cached block back to the kernel.
void empty_cache();

// Sets the peaks to the current values (the cache's own limit keeps its lifetime peak).
void reset_peak_memory_stats();

// False under AddressSanitizer or with HSGD_MALLOC_DEFAULTS=1: every block then comes from
// operator new and nothing is cached.
bool block_cache_enabled();

namespace detail {
// bytes >= 1. Throws std::bad_alloc when the kernel refuses.
void* allocate_block(size_t bytes);
// p and bytes as returned by / passed to allocate_block.
void free_block(void* p, size_t bytes) noexcept;
}  // namespace detail

}  // namespace hsgd
