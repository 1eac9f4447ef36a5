#include "framework/tensor/storage.h"

#include <new>

namespace hsgd {

namespace {
// Cache-line alignment lets the compiler and OpenBLAS use aligned vector loads.
constexpr std::align_val_t kAlignment{64};
}  // namespace

Storage::Storage(int64_t numel) : numel_(numel) {
  if (numel_ > 0) {
    data_ = static_cast<float*>(::operator new[](sizeof(float) * numel_, kAlignment));
  }
}

Storage::~Storage() {
  if (data_ != nullptr) ::operator delete[](data_, kAlignment);
}

}  // namespace hsgd
