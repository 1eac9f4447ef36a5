#pragma once
// Internal: iteration over N same-shaped strided operands, the core of the elementwise kernels.
// Dimensions of size 1 are dropped and adjacent dimensions that are contiguous with each other in
// every operand are merged, so a contiguous tensor becomes a single row and a bias broadcast over
// (N,C) becomes N rows of C. The body then runs once per innermost row:
//   body(n, ptrs, inner_strides)   // row of n elements; ptrs[k] its start in operand k
// and is a template argument, so there is no per-element indirect call.

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "framework/tensor/tensor.h"

namespace hsgd::detail {

template <size_t N, typename Body>
void strided_loop(const Shape& shape, std::array<float*, N> base,
                  std::array<const std::vector<int64_t>*, N> strides, Body&& body) {
  std::vector<int64_t> sizes;
  std::array<std::vector<int64_t>, N> st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return;
    if (shape[d] == 1) continue;
    bool merge = !sizes.empty();
    for (size_t k = 0; k < N && merge; ++k) {
      merge = st[k].back() == (*strides[k])[d] * shape[d];
    }
    if (merge) {
      sizes.back() *= shape[d];
      for (size_t k = 0; k < N; ++k) st[k].back() = (*strides[k])[d];
    } else {
      sizes.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) st[k].push_back((*strides[k])[d]);
    }
  }
  std::array<int64_t, N> inner{};
  if (sizes.empty()) {  // a single element
    body(int64_t{1}, base, inner);
    return;
  }
  const size_t outer_dims = sizes.size() - 1;
  const int64_t n = sizes.back();
  for (size_t k = 0; k < N; ++k) inner[k] = st[k].back();
  std::vector<int64_t> counter(outer_dims, 0);
  std::array<float*, N> ptrs = base;
  while (true) {
    body(n, ptrs, inner);
    // Advance the odometer over the outer dimensions, last fastest.
    size_t d = outer_dims;
    while (d > 0) {
      --d;
      if (++counter[d] < sizes[d]) {
        for (size_t k = 0; k < N; ++k) ptrs[k] += st[k][d];
        break;
      }
      for (size_t k = 0; k < N; ++k) ptrs[k] -= st[k][d] * (sizes[d] - 1);
      counter[d] = 0;
      if (d == 0) return;
    }
    if (outer_dims == 0) return;
  }
}

// Strides that broadcast `from` (aligned right) to `to`: 0 where `from` has size 1 or no dim.
std::vector<int64_t> broadcast_strides(const Shape& from_shape, const std::vector<int64_t>& from,
                                       const Shape& to);

}  // namespace hsgd::detail
