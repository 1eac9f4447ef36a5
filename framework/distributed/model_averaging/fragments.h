#pragma once
// Fragments of a streaming level (LevelOptions::fragments, level_options.h): where the flat
// vector of the averaged tensors is cut, and at which step of the period each piece averages.
// Internal to the averagers (averagers.h states the schedule, averaging_level.h the arithmetic
// of one fragment).
//
// The split (every rank computes the same, from the shapes that the averager's first averaging
// checked to agree across the group):
//   - x is the flat vector of the parameters with a gradient (P tensors, sizes s_0..s_{P-1},
//     n_params values in all), then the option buffers (n - n_params values);
//   - fragment f is a contiguous run of whole parameter tensors; the cut before fragment f
//     (f = 1..F-1) is the tensor boundary whose cumulative size is closest to f * n_params / F
//     (the earlier boundary on a tie), keeping at least one tensor in every fragment;
//   - the option buffers go with the last fragment (they are averaged with it, as plain values
//     beside its parameters, see averaging_level.h).
// So the fragments hold whole tensors, about n_params / F values each (a tensor larger than that
// makes its fragment larger), and F must not exceed P.
//
// The schedule: fragment f of a level of period H starts at the steps of offset f * H / F
// (integer division) within the period, see fragment_offset.
//
// Usage:
//   const std::vector<int64_t> sizes = {100, 100, 50, 50};  // parameter tensors, in order
//   auto parts = detail::split_fragments(sizes, /*n_buffers=*/4, /*fragments=*/2, "level 1");
//   // parts[0] = {.offset = 0, .size = 100, .n_params = 100}   (cut at 100: |100 - 150| = 50
//   //                                                           ties with |200 - 150|: earlier)
//   // parts[1] = {.offset = 100, .size = 204, .n_params = 200}

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace hsgd::distributed::detail {

// A fragment's place in x: values [offset, offset + size), of which the first n_params are
// parameters and the rest option buffers (only in the last fragment).
struct Fragment {
  int64_t offset = 0;
  int64_t size = 0;
  int64_t n_params = 0;

  bool operator==(const Fragment&) const = default;
};

// The F fragments of x (see the file comment). param_sizes: the sizes of the parameter tensors
// in x's order; n_buffers: the values of the option buffers after them. Throws InvalidArgument
// naming `who`, F and P when F > P ("fragments 5 exceed the 3 parameter tensors with a
// gradient"), or when F < 1.
std::vector<Fragment> split_fragments(std::span<const int64_t> param_sizes, int64_t n_buffers,
                                      int64_t fragments, const std::string& who);

// The step within the period at which fragment f of F starts: f * period / F, in [0, period).
inline int64_t fragment_offset(int64_t period, int64_t fragments, int64_t f) {
  return f * period / fragments;
}

}  // namespace hsgd::distributed::detail
