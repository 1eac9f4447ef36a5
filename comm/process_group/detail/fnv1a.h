#pragma once
// FNV-1a, 64 bits: the one hash of comm, for what ranks compare cheaply before (or instead of)
// exchanging the values themselves (collective fingerprints, agreement checks). Not
// cryptographic; equal inputs hash equal on every platform.

#include <cstdint>
#include <string_view>

namespace hsgd::detail {

inline constexpr uint64_t kFnv1aOffsetBasis = 1469598103934665603ull;

// The hash of bytes continued from h (pass a previous result to hash a concatenation).
inline uint64_t fnv1a(std::string_view bytes, uint64_t h = kFnv1aOffsetBasis) {
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace hsgd::detail
