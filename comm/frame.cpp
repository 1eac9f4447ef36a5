#include "comm/frame.h"

#include <limits>

#include "comm/error.h"

namespace hsgd::comm {

std::array<uint8_t, kFrameHeaderBytes> encode_frame_header(uint32_t length) {
  return {static_cast<uint8_t>(length >> 24), static_cast<uint8_t>(length >> 16),
          static_cast<uint8_t>(length >> 8), static_cast<uint8_t>(length)};
}

uint32_t decode_frame_header(const uint8_t* header) {
  return (uint32_t{header[0]} << 24) | (uint32_t{header[1]} << 16) | (uint32_t{header[2]} << 8) |
         uint32_t{header[3]};
}

std::string encode_frame(const google::protobuf::MessageLite& message, size_t max_frame_bytes,
                         const char* what_for) {
  const size_t size = message.ByteSizeLong();
  HSGD_CHECK(size <= max_frame_bytes && size <= std::numeric_limits<uint32_t>::max(), what_for,
             ": message of ", size, " bytes exceeds the frame limit of ", max_frame_bytes,
             " bytes");
  std::string frame(kFrameHeaderBytes + size, '\0');
  const auto header = encode_frame_header(static_cast<uint32_t>(size));
  frame.replace(0, kFrameHeaderBytes, reinterpret_cast<const char*>(header.data()),
                kFrameHeaderBytes);
  HSGD_CHECK_AS(CommError,
                message.SerializeToArray(frame.data() + kFrameHeaderBytes, static_cast<int>(size)),
                what_for, ": failed to serialize a message of ", size, " bytes");
  return frame;
}

}  // namespace hsgd::comm
