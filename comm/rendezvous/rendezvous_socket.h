#pragma once
// Blocking socket I/O with deadlines for TcpStore (the client side of the rendezvous protocol).
// Internal to comm/rendezvous/tcp_store.cpp.
//
// Every call takes an absolute deadline and waits with poll(), so nothing blocks forever; a
// failure throws SocketFailure, which TcpStore turns into hsgd::Timeout or hsgd::CommError
// naming the endpoint, the operation and the keys.

#include <google/protobuf/message_lite.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/tls/tls.h"

namespace hsgd::comm {

struct SocketFailure {
  bool timed_out;    // the deadline passed (otherwise: refused, reset, closed, malformed)
  std::string what;  // e.g. "connect: Connection refused"
  // The server answered the TLS handshake and refused it (it holds another key for this
  // identity, or none): not an outage, trying again cannot succeed.
  bool refused = false;
};

using SocketClock = std::chrono::steady_clock;

// A connected, non-blocking TCP socket with TCP_NODELAY, plain or (after start_tls) TLS;
// closes on destruction.
class Socket {
 public:
  // Resolves host (IPv4 or IPv6) and connects, trying each address until deadline.
  Socket(const std::string& host, int port, SocketClock::time_point deadline);
  ~Socket();
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // True when the server closed the connection or it failed (it is readable or in error while
  // no reply is pending: the server never sends unasked). Never blocks.
  bool peer_closed() const;

  // Runs the TLS handshake as client under identity with key psk; every later byte is
  // encrypted. A refused handshake throws SocketFailure with refused set.
  void start_tls(std::shared_ptr<tls::Context> context, std::string identity, const tls::Psk& psk,
                 SocketClock::time_point deadline);

  void write_all(const std::string& data, SocketClock::time_point deadline);
  // Reads one frame (header + body) into message; a frame above max_bytes is a failure.
  void read_frame(google::protobuf::MessageLite& message, size_t max_bytes,
                  SocketClock::time_point deadline);

 private:
  void read_exact(uint8_t* out, size_t size, SocketClock::time_point deadline);

  int fd_ = -1;
  std::unique_ptr<tls::Stream> tls_;  // declared after fd_: freed before the fd closes
};

}  // namespace hsgd::comm
