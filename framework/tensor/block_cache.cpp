#include "framework/tensor/block_cache.h"

#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <list>
#include <mutex>
#include <new>
#include <string_view>
#include <unordered_map>

namespace hsgd {
namespace {

// Cache-line alignment lets the compiler and OpenBLAS use aligned vector loads.
constexpr std::align_val_t kAlignment{64};
constexpr size_t kCachedBytes = size_t{256} << 10;  // smaller blocks: operator new
constexpr size_t kPage = 4096;
constexpr int64_t kMinLimit = int64_t{64} << 20;
constexpr double kLimitOverPeak = 1.5;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

bool malloc_defaults_requested() {
  const char* keep = std::getenv("HSGD_MALLOC_DEFAULTS");
  return keep != nullptr && std::string_view(keep) == "1";
}

// The non-tensor memory (kernel scratch, small blocks) still comes from glibc's heap: blocks up
// to 32 MiB (glibc's largest allowed mmap threshold) stay in the heap, and up to 1 GiB of freed
// heap is kept instead of trimmed, so that per-call scratch is not faulted in again every step.
void tune_malloc() {
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  ::mallopt(M_TOP_PAD, 64 << 20);
}

class BlockCache {
 public:
  BlockCache() : enabled_(!kAddressSanitizer && !malloc_defaults_requested()) {
    if (!malloc_defaults_requested()) tune_malloc();
    // fork() while another thread holds mu_ would leave the child's copy locked forever.
    // pthread_atfork fails only without memory for the handler; the cache then still works
    // in every process that does not fork while another thread allocates.
    (void)::pthread_atfork([] { instance().mu_.lock(); }, [] { instance().mu_.unlock(); },
                           [] { instance().mu_.unlock(); });
  }
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // Never destroyed: tensors in static storage may outlive any destructor order.
  static BlockCache& instance() {
    static BlockCache* cache = new BlockCache;
    return *cache;
  }

  void* allocate(size_t bytes) {
    if (!enabled_ || bytes < kCachedBytes) {
      void* p = ::operator new(bytes, kAlignment);
      std::lock_guard<std::mutex> lock(mu_);
      count_in(static_cast<int64_t>(bytes), /*mapped=*/true);
      return p;
    }
    const size_t size = round_up(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (void* p = take_idle(size)) {
      count_in(static_cast<int64_t>(size), /*mapped=*/false);
      return p;
    }
    evict_for(static_cast<int64_t>(size));
    void* p = map(size);
    if (p == nullptr) {  // the kernel refused: give back everything idle and try once more
      while (!lru_.empty()) unmap_oldest();
      p = map(size);
      if (p == nullptr) throw std::bad_alloc();
    }
    count_in(static_cast<int64_t>(size), /*mapped=*/true);
    return p;
  }

  void free(void* p, size_t bytes) noexcept {
    if (!enabled_ || bytes < kCachedBytes) {
      ::operator delete(p, kAlignment);
      std::lock_guard<std::mutex> lock(mu_);
      count_out(static_cast<int64_t>(bytes), /*unmapped=*/true);
      return;
    }
    const size_t size = round_up(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    // Allocation can throw only before the block is parked; on failure the block is unmapped.
    try {
      lru_.push_back({p, size});
      by_size_[size].push_back(std::prev(lru_.end()));
    } catch (...) {
      if (!lru_.empty() && lru_.back().p == p) lru_.pop_back();
      ::munmap(p, size);
      ++stats_.unmaps;
      count_out(static_cast<int64_t>(size), /*unmapped=*/true);
      return;
    }
    ++stats_.cached_blocks;
    count_out(static_cast<int64_t>(size), /*unmapped=*/false);
  }

  bool enabled() const { return enabled_; }

  MemoryStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    MemoryStats out = stats_;
    out.limit_bytes = limit(0);
    return out;
  }

  void empty() {
    std::lock_guard<std::mutex> lock(mu_);
    while (!lru_.empty()) unmap_oldest();
  }

  void reset_peaks() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
    stats_.peak_reserved_bytes = stats_.reserved_bytes;
  }

 private:
  struct Idle {
    void* p;
    size_t size;
  };
  using IdleList = std::list<Idle>;

  static size_t round_up(size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

  static void* map(size_t size) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }

  // The most recently freed idle block of exactly this size (its pages are likeliest in cache),
  // or null.
  void* take_idle(size_t size) {
    auto found = by_size_.find(size);
    if (found == by_size_.end() || found->second.empty()) return nullptr;
    const IdleList::iterator it = found->second.back();
    found->second.pop_back();
    if (found->second.empty()) by_size_.erase(found);  // sizes seen once must not pile up
    void* p = it->p;
    lru_.erase(it);
    --stats_.cached_blocks;
    return p;
  }

  // Unmaps idle blocks, least recently freed first, until mapping `size` more stays within the
  // limit or nothing idle is left.
  void evict_for(int64_t size) {
    const int64_t most = limit(size);
    while (!lru_.empty() && mapped_ + size > most) unmap_oldest();
  }

  // max(64 MiB, 1.5 x the highest live total, counting a request of `size` more).
  int64_t limit(int64_t size) const {
    const int64_t live = std::max(lifetime_peak_, stats_.allocated_bytes + size);
    return std::max<int64_t>(kMinLimit,
                             static_cast<int64_t>(kLimitOverPeak * static_cast<double>(live)));
  }

  void unmap_oldest() {
    const Idle oldest = lru_.front();
    // The globally oldest idle block is the oldest of its size: the front of its list.
    std::deque<IdleList::iterator>& same = by_size_[oldest.size];
    same.pop_front();
    if (same.empty()) by_size_.erase(oldest.size);
    lru_.pop_front();
    ::munmap(oldest.p, oldest.size);
    mapped_ -= static_cast<int64_t>(oldest.size);
    stats_.reserved_bytes -= static_cast<int64_t>(oldest.size);
    --stats_.cached_blocks;
    ++stats_.unmaps;
  }

  // mapped: the block is new to the process (not taken from the idle lists).
  void count_in(int64_t size, bool mapped) {
    stats_.allocated_bytes += size;
    if (mapped) {
      stats_.reserved_bytes += size;
      if (enabled_ && static_cast<size_t>(size) >= kCachedBytes) {
        mapped_ += size;
        ++stats_.maps;
      }
    }
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    lifetime_peak_ = std::max(lifetime_peak_, stats_.allocated_bytes);
  }

  // unmapped: the block left the process (small blocks); otherwise it went to the idle lists.
  void count_out(int64_t size, bool unmapped) {
    stats_.allocated_bytes -= size;
    if (unmapped) {
      stats_.reserved_bytes -= size;
      if (enabled_ && static_cast<size_t>(size) >= kCachedBytes) mapped_ -= size;
    }
  }

  // Constant after construction.
  const bool enabled_;

  // Guarded by mu_.
  std::mutex mu_;
  IdleList lru_;  // idle blocks, least recently freed first
  std::unordered_map<size_t, std::deque<IdleList::iterator>> by_size_;  // oldest first
  MemoryStats stats_;
  int64_t mapped_ = 0;         // cached-size blocks mapped now, in use or idle
  int64_t lifetime_peak_ = 0;  // highest allocated_bytes ever (not reset)
};

}  // namespace

MemoryStats memory_stats() { return BlockCache::instance().stats(); }

void empty_cache() { BlockCache::instance().empty(); }

void reset_peak_memory_stats() { BlockCache::instance().reset_peaks(); }

bool block_cache_enabled() { return BlockCache::instance().enabled(); }

namespace detail {

void* allocate_block(size_t bytes) { return BlockCache::instance().allocate(bytes); }

void free_block(void* p, size_t bytes) noexcept { BlockCache::instance().free(p, bytes); }

}  // namespace detail
}  // namespace hsgd
