#include "comm/rendezvous/frame.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "comm/error.h"

namespace hsgd::comm {

namespace {

// The body buffer a decoder keeps between frames, at most.
constexpr size_t kKeptBufferBytes = 4096;

}  // namespace

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
  return encode_frame_head(message, 0, max_frame_bytes, what_for);
}

std::string encode_frame_head(const google::protobuf::MessageLite& head, size_t tail_bytes,
                              size_t max_frame_bytes, const char* what_for) {
  const size_t head_bytes = head.ByteSizeLong();
  const size_t size = head_bytes + tail_bytes;
  HSGD_CHECK(size <= max_frame_bytes && size <= std::numeric_limits<uint32_t>::max(), what_for,
             ": message of ", size, " bytes exceeds the frame limit of ", max_frame_bytes,
             " bytes");
  std::string frame(kFrameHeaderBytes + head_bytes, '\0');
  const auto header = encode_frame_header(static_cast<uint32_t>(size));
  frame.replace(0, kFrameHeaderBytes, reinterpret_cast<const char*>(header.data()),
                kFrameHeaderBytes);
  HSGD_CHECK_AS(
      CommError,
      head.SerializeToArray(frame.data() + kFrameHeaderBytes, static_cast<int>(head_bytes)),
      what_for, ": failed to serialize a message of ", head_bytes, " bytes");
  return frame;
}

size_t FrameDecoder::wanted() const {
  if (state_ != State::kNeedMore) return 0;
  if (header_used_ < kFrameHeaderBytes) return kFrameHeaderBytes - header_used_;
  return announced_ - body_.size();
}

std::span<uint8_t> FrameDecoder::prepare(size_t n) {
  n = std::min(n, wanted());
  if (header_used_ < kFrameHeaderBytes) {
    prepared_ = n;
    return {header_.data() + header_used_, n};
  }
  const size_t used = body_.size();
  body_.resize(used + n);  // grows by what is about to be read, not by what was announced
  prepared_ = n;
  return {reinterpret_cast<uint8_t*>(body_.data()) + used, n};
}

FrameDecoder::State FrameDecoder::commit(size_t n) {
  n = std::min(n, prepared_);
  if (header_used_ < kFrameHeaderBytes) {
    header_used_ += n;
    prepared_ = 0;
    if (header_used_ < kFrameHeaderBytes) return state_;
    announced_ = decode_frame_header(header_.data());
    if (announced_ > max_frame_bytes_) return state_ = State::kOversized;
  } else {
    body_.resize(body_.size() - (prepared_ - n));
    prepared_ = 0;
  }
  if (body_.size() == announced_) state_ = State::kFrame;
  return state_;
}

size_t FrameDecoder::feed(std::span<const uint8_t> bytes) {
  size_t taken = 0;
  while (state_ == State::kNeedMore && taken < bytes.size()) {
    auto space = prepare(bytes.size() - taken);
    std::memcpy(space.data(), bytes.data() + taken, space.size());
    taken += space.size();
    commit(space.size());
  }
  return taken;
}

void FrameDecoder::next() {
  header_used_ = 0;
  announced_ = 0;
  prepared_ = 0;
  state_ = State::kNeedMore;
  // Thousands of connections each holding the buffer of their last multi_get (tens of KiB with
  // thousands of keys) would add up to hundreds of MiB; a small one is kept for the next frame.
  if (body_.capacity() > kKeptBufferBytes) {
    std::string().swap(body_);
  } else {
    body_.clear();
  }
}

}  // namespace hsgd::comm
