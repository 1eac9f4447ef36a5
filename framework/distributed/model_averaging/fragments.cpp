#include "framework/distributed/model_averaging/fragments.h"

#include <cstdlib>

#include "comm/error.h"

namespace hsgd::distributed::detail {

std::vector<Fragment> split_fragments(std::span<const int64_t> param_sizes, int64_t n_buffers,
                                      int64_t fragments, const std::string& who) {
  const auto tensors = static_cast<int64_t>(param_sizes.size());
  HSGD_CHECK(fragments >= 1, who, ": fragments must be >= 1, got ", fragments);
  if (fragments > tensors) {
    HSGD_THROW(InvalidArgument, who, ": fragments ", fragments, " exceed the ", tensors,
               " parameter tensors with a gradient; a fragment holds whole tensors, so give "
               "fragments <= ",
               tensors);
  }
  // cumulative[j]: the values of the first j tensors.
  std::vector<int64_t> cumulative(param_sizes.size() + 1, 0);
  for (size_t j = 0; j < param_sizes.size(); ++j) {
    cumulative[j + 1] = cumulative[j] + param_sizes[j];
  }
  const int64_t n_params = cumulative.back();
  // cut[f]: the number of tensors before fragment f.
  std::vector<int64_t> cut(static_cast<size_t>(fragments + 1), 0);
  cut.back() = tensors;
  for (int64_t f = 1; f < fragments; ++f) {
    // Doubles: f * n_params may exceed int64 only for absurd sizes, but the target need not be
    // an integer anyway.
    const double target =
        static_cast<double>(f) * static_cast<double>(n_params) / static_cast<double>(fragments);
    const int64_t lowest = cut[static_cast<size_t>(f - 1)] + 1;
    const int64_t highest = tensors - (fragments - f);
    int64_t best = lowest;
    for (int64_t j = lowest + 1; j <= highest; ++j) {
      const auto distance = [&](int64_t k) {
        return std::abs(static_cast<double>(cumulative[static_cast<size_t>(k)]) - target);
      };
      if (distance(j) < distance(best)) best = j;
    }
    cut[static_cast<size_t>(f)] = best;
  }
  std::vector<Fragment> out;
  for (int64_t f = 0; f < fragments; ++f) {
    const int64_t begin = cumulative[static_cast<size_t>(cut[static_cast<size_t>(f)])];
    const int64_t end = cumulative[static_cast<size_t>(cut[static_cast<size_t>(f + 1)])];
    const bool last = f + 1 == fragments;
    out.push_back(Fragment{
        .offset = begin, .size = end - begin + (last ? n_buffers : 0), .n_params = end - begin});
  }
  return out;
}

}  // namespace hsgd::distributed::detail
