#include "framework/tensor/storage.h"

#include <limits>
#include <new>

#include "framework/tensor/block_cache.h"

namespace hsgd {

// The blocks come from block_cache.h: large ones are reused by size across training steps.
Storage::Storage(int64_t numel) : numel_(numel) {
  // sizeof(float) * numel must not wrap.
  if (numel_ > std::numeric_limits<int64_t>::max() / static_cast<int64_t>(sizeof(float))) {
    throw std::bad_alloc();
  }
  if (numel_ > 0) data_ = static_cast<float*>(detail::allocate_block(sizeof(float) * numel_));
}

Storage::~Storage() {
  if (data_ != nullptr) detail::free_block(data_, sizeof(float) * numel_);
}

}  // namespace hsgd
