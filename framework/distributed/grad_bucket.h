#pragma once
// GradBucket: what a DDP communication hook receives — one flat buffer holding the gradients of
// several parameters, like torch.distributed.GradBucket.
//
// The buffer is owned by DDP and reused every iteration. When the hook is called it holds this
// rank's gradients of parameters() (zeros for a parameter that got no gradient this pass),
// parameter i at [offsets()[i], offsets()[i] + parameters()[i].numel()). The hook must leave
// the reduced gradients in the same buffer by the time its returned Work completes (or at once
// when it returns nullptr); DDP then copies them back into each parameter's grad().
//
// Buckets are numbered in the order DDP launches them: bucket 0 holds the LAST registered
// parameters (their gradients are ready first in backward); is_last() marks the final bucket of
// an iteration.

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "framework/tensor/tensor.h"

namespace hsgd::distributed {

class GradBucket {
 public:
  GradBucket(int64_t index, bool is_last, Tensor buffer, std::vector<Tensor> parameters,
             std::vector<int64_t> offsets)
      : index_(index),
        is_last_(is_last),
        buffer_(std::move(buffer)),
        parameters_(std::move(parameters)),
        offsets_(std::move(offsets)) {}

  int64_t index() const { return index_; }
  bool is_last() const { return is_last_; }
  // The flat gradient buffer, shape (numel,). A shallow handle: writes go to DDP's buffer.
  Tensor& buffer() { return buffer_; }
  // The same memory as a span, for ProcessGroup collectives.
  std::span<float> data() { return {buffer_.data(), static_cast<size_t>(buffer_.numel())}; }
  const std::vector<Tensor>& parameters() const { return parameters_; }
  // Start of each parameter's gradient in buffer(), parallel to parameters().
  const std::vector<int64_t>& offsets() const { return offsets_; }

 private:
  int64_t index_;
  bool is_last_;
  Tensor buffer_;
  std::vector<Tensor> parameters_;
  std::vector<int64_t> offsets_;
};

}  // namespace hsgd::distributed
