#pragma once
// Rank lists as error messages name them, in one place for every layer: "[0, 3, 5]" where a
// message lists ranks (a store barrier's missing ranks, the ranks holding one value of an
// agreement check) and "ranks 0, 2-3" where it reads as a sentence (a failure report, a model
// check).

#include <string>
#include <vector>

namespace hsgd::detail {

// "[0, 3, 5]".
inline std::string format_ranks(const std::vector<int>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out + "]";
}

// "rank 3", "ranks 1-3", "ranks 0, 2, 5-7": sorted ranks with runs of three or more collapsed.
inline std::string describe_rank_set(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace hsgd::detail
