#include "framework/tensor/storage.h"

#include <malloc.h>

#include <cstdlib>
#include <mutex>
#include <new>
#include <string_view>

namespace hsgd {

namespace {
// Cache-line alignment lets the compiler and OpenBLAS use aligned vector loads.
constexpr std::align_val_t kAlignment{64};

// A training step frees and allocates the same activation and gradient blocks every step. With
// glibc's defaults, blocks above the (dynamic) mmap threshold are mapped and unmapped each time,
// and freed memory at the top of the heap is trimmed, so every page is faulted in and zeroed by
// the kernel again on the next step: ~250,000 minor faults in 30 ResNet-20 steps at batch 32,
// and with 4 ranks on 2 cores the faults contend in the kernel (ddp_bench ResNet-20: 244 ms a
// step with the defaults, 169 ms with these settings). So: blocks up to 32 MiB (glibc's
// largest allowed threshold) come from the heap, and up to 1 GiB of freed heap is kept instead
// of trimmed. Set once, at the first Storage; HSGD_MALLOC_DEFAULTS=1 keeps glibc's defaults.
void tune_malloc_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* keep = std::getenv("HSGD_MALLOC_DEFAULTS");
    if (keep != nullptr && std::string_view(keep) == "1") return;
    ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
    ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
    ::mallopt(M_TOP_PAD, 64 << 20);
  });
}
}  // namespace

Storage::Storage(int64_t numel) : numel_(numel) {
  if (numel_ > 0) {
    tune_malloc_once();
    data_ = static_cast<float*>(::operator new[](sizeof(float) * numel_, kAlignment));
  }
}

Storage::~Storage() {
  if (data_ != nullptr) ::operator delete[](data_, kAlignment);
}

}  // namespace hsgd
