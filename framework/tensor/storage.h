#pragma once
// Storage: one contiguous, 64-byte aligned block of float32 owned by every Tensor that views it.
// Tensors hold it through std::shared_ptr, so the block lives as long as the last view.
// Elements are left uninitialised by the constructor; factories fill them.

#include <cstdint>

namespace hsgd {

class Storage {
 public:
  // Allocates numel floats (numel >= 0; zero allocates nothing). Throws std::bad_alloc.
  explicit Storage(int64_t numel);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  int64_t numel() const { return numel_; }

 private:
  float* data_ = nullptr;
  int64_t numel_ = 0;
};

}  // namespace hsgd
