#pragma once
// What hsgd's TLS transport puts on the wire and in the store (comm-internal).
//
// - A pair's address (Pair::address().bytes(), exchanged through the store by connectFullMesh):
//   the owner's rank, its pair id (unique within its device) and its device's listening address.
// - After the handshake, each direction of a connection is a sequence of frames: a FrameHeader,
//   then `length` payload bytes. kBuffer frames land in the peer's bound receive buffer of `slot`
//   at `offset`; kUnbound frames go to the peer's receive posted for tag `slot` from this rank.

#include <sys/socket.h>

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace hsgd::comm::transport::detail {

constexpr uint32_t kAddressMagic = 0x48534754;  // "HSGT"

struct WireAddress {
  uint32_t magic = kAddressMagic;
  int32_t rank = -1;
  uint64_t pair_id = 0;
  sockaddr_storage listen{};
};
static_assert(sizeof(WireAddress) <= 192, "gloo::transport::Address::kMaxByteSize");

// kAck (no payload) tells the sender of a kUnbound message of tag `slot` that a receive took it:
// its send completes then, as in Gloo's TCP transport (a sender waits for its receiver).
enum class FrameKind : uint32_t { kBuffer = 1, kUnbound = 2, kAck = 3 };

struct FrameHeader {
  uint32_t kind = 0;
  uint32_t reserved = 0;
  uint64_t slot = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};
static_assert(sizeof(FrameHeader) == 32);

// The "who" of a data connection's identity: "<from> -> <to> <pair id>".
inline std::string connection_name(int from, int to, uint64_t pair_id) {
  return std::to_string(from) + " -> " + std::to_string(to) + " " + std::to_string(pair_id);
}

struct ConnectionName {
  int from = -1;
  int to = -1;
  uint64_t pair_id = 0;
};

// Parses connection_name()'s text; nullopt for anything else.
inline std::optional<ConnectionName> parse_connection_name(std::string_view text) {
  ConnectionName name;
  const char* p = text.data();
  const char* end = text.data() + text.size();
  auto number = [&](auto& out) {
    auto [next, ec] = std::from_chars(p, end, out);
    if (ec != std::errc() || next == p) return false;
    p = next;
    return true;
  };
  auto literal = [&](std::string_view word) {
    if (static_cast<size_t>(end - p) < word.size() || std::string_view(p, word.size()) != word) {
      return false;
    }
    p += word.size();
    return true;
  };
  if (!number(name.from) || !literal(" -> ") || !number(name.to) || !literal(" ") ||
      !number(name.pair_id) || p != end || name.from < 0 || name.to < 0) {
    return std::nullopt;
  }
  return name;
}

}  // namespace hsgd::comm::transport::detail
