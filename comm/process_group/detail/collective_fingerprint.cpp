#include "comm/process_group/detail/collective_fingerprint.h"

#include <string_view>

namespace hsgd::detail {
namespace {

uint64_t fnv1a(uint64_t h, std::string_view bytes) {
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

std::string CollectiveFingerprint::describe() const {
  std::string out = kind;
  if (*dtype != '\0') {
    out += " (" + std::to_string(count) + " x " + dtype;
    if (!args.empty()) out += ", " + args;
    out += ")";
  }
  out += " #" + std::to_string(seq);
  if (!label.empty()) out += " '" + label + "'";
  return out;
}

uint32_t CollectiveFingerprint::shape_hash() const {
  uint64_t h = 1469598103934665603ull;
  h = fnv1a(h, kind);
  h = fnv1a(h, "|");
  h = fnv1a(h, dtype);
  h = fnv1a(h, "|");
  h = fnv1a(h, std::to_string(count));
  h = fnv1a(h, "|");
  h = fnv1a(h, args);
  return static_cast<uint32_t>(h ^ (h >> 32));
}

uint32_t gloo_tag(uint64_t seq, uint32_t shape_hash) {
  return static_cast<uint32_t>(seq & 0xFFFFFu) | ((shape_hash & 0xFFFu) << 20);
}

std::string describe_rank_set(const std::vector<int>& ranks) {
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
