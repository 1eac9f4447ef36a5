#pragma once
// Framing of the rendezvous protocol (comm/rendezvous/proto/rendezvous.proto), shared by the server
// and TcpStore: a frame is a 4-byte big-endian length followed by that many bytes of one serialized
// protobuf message.

#include <google/protobuf/message_lite.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace hsgd::comm {

// "HSGD" in ASCII: the first field of every Hello.
inline constexpr uint32_t kProtocolMagic = 0x48534744;
// Bumped on any change an older peer would misread. 2: TLS 1.3 keyed by the token, which the
// Hello no longer carries.
inline constexpr uint32_t kProtocolVersion = 2;
inline constexpr size_t kFrameHeaderBytes = 4;

// Encodes a frame length as the 4-byte big-endian header.
std::array<uint8_t, kFrameHeaderBytes> encode_frame_header(uint32_t length);

// Decodes a 4-byte big-endian header.
uint32_t decode_frame_header(const uint8_t* header);

// Returns header + serialized message, ready to write. Throws hsgd::InvalidArgument when the
// message is larger than max_frame_bytes (the message names both sizes and what_for).
std::string encode_frame(const google::protobuf::MessageLite& message, size_t max_frame_bytes,
                         const char* what_for);

// The start of a frame whose body is the serialized head followed by tail_bytes more bytes that
// the caller already holds serialized (one encoding shared by many frames): returns header +
// serialized head; the frame is that, then the tail. Serialized messages concatenate as a merge,
// so when every field of the tail has a higher number than every field of head, head + tail is
// byte for byte what protobuf writes for the whole message. Throws hsgd::InvalidArgument like
// encode_frame when the body exceeds max_frame_bytes.
std::string encode_frame_head(const google::protobuf::MessageLite& head, size_t tail_bytes,
                              size_t max_frame_bytes, const char* what_for);

// FrameDecoder: assembles frames from bytes as they arrive, holding only what arrived.
//
// The length in a header is a claim, not a fact: the body buffer grows with the bytes that came
// (at most twice that, by std::string's growth), never to the announced size up front, so a
// client announcing 8 MiB and sending 10 bytes costs 10 bytes. A header above the current limit
// is reported as soon as its 4 bytes are in, before any body byte is read.
//
// Usage (the server's read loop):
//   FrameDecoder decoder(4096);
//   const int fd = 0;   // a connected socket
//   auto space = decoder.prepare(decoder.wanted());
//   const ssize_t n = ::read(fd, space.data(), space.size());
//   if (n > 0 && decoder.commit(static_cast<size_t>(n)) == FrameDecoder::State::kFrame) {
//     const std::string& frame = decoder.frame();   // one whole frame
//     decoder.next();
//   }
class FrameDecoder {
 public:
  enum class State {
    kNeedMore,   // the header or the body is incomplete
    kFrame,      // frame() is complete; call next() before feeding more
    kOversized,  // the header announced announced() bytes, above the limit: stop reading
  };

  explicit FrameDecoder(size_t max_frame_bytes) : max_frame_bytes_(max_frame_bytes) {}

  // The limit applies to frames whose header has not been read yet (the server raises it after
  // the handshake).
  void set_limit(size_t max_frame_bytes) { max_frame_bytes_ = max_frame_bytes; }

  // Bytes still missing from the current header or body (>= 1 unless a frame is complete).
  size_t wanted() const;
  // Room for n <= wanted() bytes at the end of what arrived; valid until commit().
  std::span<uint8_t> prepare(size_t n);
  // n of the prepared bytes were written (the rest are given back).
  State commit(size_t n);
  // Feeds bytes from memory (tests, fuzzing): consumes bytes up to the end of one frame (or of
  // an oversized header) and returns how many it took; state() tells what happened.
  size_t feed(std::span<const uint8_t> bytes);

  State state() const { return state_; }
  // The body of the complete frame (state() == kFrame).
  const std::string& frame() const { return body_; }
  // The length announced by the current header (valid once the header is complete).
  uint32_t announced() const { return announced_; }
  // Bytes held for the current frame (header and body so far).
  size_t buffered_bytes() const { return header_used_ + body_.size(); }
  // Forgets the complete frame and gives back a buffer larger than 4 KiB, so an idle connection
  // holds at most that after a big request.
  void next();

 private:
  size_t max_frame_bytes_;
  std::array<uint8_t, kFrameHeaderBytes> header_{};
  size_t header_used_ = 0;
  uint32_t announced_ = 0;
  std::string body_;
  size_t prepared_ = 0;  // bytes handed out by prepare() at the end of header_ or body_
  State state_ = State::kNeedMore;
};

}  // namespace hsgd::comm
