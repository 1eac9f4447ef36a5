#include "comm/process_group/detail/collective_fingerprint.h"

#include "comm/process_group/detail/fnv1a.h"

namespace hsgd::detail {

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
  uint64_t h = fnv1a(kind);
  h = fnv1a("|", h);
  h = fnv1a(dtype, h);
  h = fnv1a("|", h);
  h = fnv1a(std::to_string(count), h);
  h = fnv1a("|", h);
  h = fnv1a(args, h);
  return static_cast<uint32_t>(h ^ (h >> 32));
}

uint32_t gloo_tag(uint64_t seq, uint32_t shape_hash) {
  return static_cast<uint32_t>(seq & 0xFFFFFu) | ((shape_hash & 0xFFFu) << 20);
}

}  // namespace hsgd::detail
