#include "framework/tensor/storage.h"

#include "framework/tensor/block_cache.h"

namespace hsgd {

// The blocks come from block_cache.h: large ones are reused by size across training steps.
Storage::Storage(int64_t numel) : numel_(numel) {
  if (numel_ > 0) data_ = static_cast<float*>(detail::allocate_block(sizeof(float) * numel_));
}

Storage::~Storage() {
  if (data_ != nullptr) detail::free_block(data_, sizeof(float) * numel_);
}

}  // namespace hsgd
