#pragma once
// Framing of the rendezvous protocol (comm/proto/rendezvous.proto), shared by the server and
// TcpStore: a frame is a 4-byte big-endian length followed by that many bytes of one serialized
// protobuf message.

#include <google/protobuf/message_lite.h>

#include <array>
#include <cstdint>
#include <string>

namespace hsgd::comm {

// "HSGD" in ASCII: the first field of every Hello.
inline constexpr uint32_t kProtocolMagic = 0x48534744;
// Bumped on any change an older peer would misread.
inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 4;

// Encodes a frame length as the 4-byte big-endian header.
std::array<uint8_t, kFrameHeaderBytes> encode_frame_header(uint32_t length);

// Decodes a 4-byte big-endian header.
uint32_t decode_frame_header(const uint8_t* header);

// Returns header + serialized message, ready to write. Throws hsgd::InvalidArgument when the
// message is larger than max_frame_bytes (the message names both sizes and what_for).
std::string encode_frame(const google::protobuf::MessageLite& message, size_t max_frame_bytes,
                         const char* what_for);

}  // namespace hsgd::comm
