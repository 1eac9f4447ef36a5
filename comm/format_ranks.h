#pragma once
// Comm-internal formatting of rank lists for error messages (process groups, shared-memory
// allreduce). Not part of the base that every layer includes (comm/error.h).

#include <string>
#include <vector>

namespace hsgd::detail {

// "[0, 3, 5]": ranks as messages name them.
inline std::string format_ranks(const std::vector<int>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out + "]";
}

}  // namespace hsgd::detail
