#pragma once
// Flatten / unflatten: many tensors packed into one flat float buffer, so that one collective
// (broadcast, allreduce) carries all of them instead of one call per tensor. The layout is the
// one torch's _flatten_dense_tensors uses: the tensors one after another in the given order,
// each in row-major order, with no padding:
//
//   flat is (n,), n = flat_numel(tensors); tensor i occupies [offset_i, offset_i + numel_i)
//   where offset_i is the sum of the numel of tensors 0..i-1.
//
// Contract:
// - Every tensor must be defined (InvalidArgument naming its index otherwise). Any strides are
//   accepted; contiguous tensors (parameters, buffers) are copied with no temporary.
// - flatten_into can divide while it copies (x / divisor, rounded exactly as a separate division
//   would be, so averaging code gets the same bits as "copy, then divide"); divisor 1 copies the
//   bits unchanged.
// - unflatten_from writes into each tensor's own memory (the storage it shares with every handle
//   of it), never records autograd history, and leaves the tensors' shapes and strides alone.
// - flat must hold at least flat_numel(tensors) elements (InvalidArgument naming both sizes
//   otherwise); the elements after them are neither read nor written. Both return the number
//   of elements used, so calls can be chained on subspans of one buffer.
//
// Usage:
//   std::vector<float> flat(static_cast<size_t>(flat_numel(params)));
//   flatten_into(params, flat);
//   pg->broadcast(std::span<float>(flat), 0)->wait();
//   unflatten_from(flat, params);

#include <cstdint>
#include <span>
#include <vector>

#include "framework/tensor/tensor.h"

namespace hsgd::distributed {

// Sum of numel over tensors: the length of their flat buffer.
int64_t flat_numel(const std::vector<Tensor>& tensors);

// Copies tensors into flat[0, flat_numel(tensors)), each element divided by divisor. Returns
// the number of elements written.
int64_t flatten_into(const std::vector<Tensor>& tensors, std::span<float> flat,
                     float divisor = 1.0f);

// Copies flat[0, flat_numel(tensors)) back into tensors (the inverse of flatten_into with
// divisor 1). Returns the number of elements read.
int64_t unflatten_from(std::span<const float> flat, const std::vector<Tensor>& tensors);

}  // namespace hsgd::distributed
