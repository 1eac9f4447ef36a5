#include "comm/rendezvous/rendezvous_socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "comm/rendezvous/frame.h"

namespace hsgd::comm {
namespace {

std::string errno_text(int error) { return std::strerror(error); }

int remaining_ms(SocketClock::time_point deadline) {
  const auto left =
      std::chrono::ceil<std::chrono::milliseconds>(deadline - SocketClock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

// Waits until fd is ready for events or the deadline passes.
void wait_ready(int fd, short events, SocketClock::time_point deadline) {
  for (;;) {
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return;  // ready, or an error the next call reports
    if (n == 0) throw SocketFailure{true, "no progress before the deadline"};
    if (errno != EINTR) throw SocketFailure{false, "poll: " + errno_text(errno)};
  }
}

int connect_one(const addrinfo& ai, SocketClock::time_point deadline) {
  const int fd =
      ::socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.ai_protocol);
  if (fd < 0) throw SocketFailure{false, "socket: " + errno_text(errno)};
  try {
    if (::connect(fd, ai.ai_addr, ai.ai_addrlen) != 0) {
      if (errno != EINPROGRESS) throw SocketFailure{false, "connect: " + errno_text(errno)};
      wait_ready(fd, POLLOUT, deadline);
      int error = 0;
      socklen_t len = sizeof(error);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
      if (error != 0) throw SocketFailure{false, "connect: " + errno_text(error)};
    }
  } catch (const SocketFailure&) {
    ::close(fd);
    throw;
  }
  // Requests are small and latency-bound: do not let Nagle hold them back.
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

Socket::Socket(const std::string& host, int port, SocketClock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
  if (rc != 0) throw SocketFailure{false, std::string("cannot resolve host: ") + gai_strerror(rc)};
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(list, freeaddrinfo);
  std::string last_error = "no address";
  for (const addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    try {
      fd_ = connect_one(*ai, deadline);
      return;
    } catch (const SocketFailure& failure) {
      if (failure.timed_out) throw;
      last_error = failure.what;
    }
  }
  throw SocketFailure{false, last_error};
}

Socket::~Socket() {
  tls_.reset();
  if (fd_ >= 0) ::close(fd_);
}

void Socket::start_tls(std::shared_ptr<tls::Context> context, std::string identity,
                       const tls::Psk& psk, SocketClock::time_point deadline) {
  tls_ = std::make_unique<tls::Stream>(fd_, std::move(context), tls::Role::kClient);
  tls_->set_client_psk(std::move(identity), psk);
  try {
    tls_->handshake(deadline);
  } catch (const tls::Failure& failure) {
    // A server that closes or resets mid-handshake may be going down (an outage, tried again);
    // any other failure is the server's TLS answering no (an alert, or not TLS at all).
    const std::string what = failure.what();
    const bool lost = what.find("closed the connection") != std::string::npos ||
                      what.find(std::strerror(ECONNRESET)) != std::string::npos ||
                      what.find(std::strerror(EPIPE)) != std::string::npos;
    throw SocketFailure{failure.timed_out, what, !failure.timed_out && !lost};
  }
}

bool Socket::peer_closed() const {
  // A TLS stream holding decrypted bytes while no reply is pending: the server sent unasked.
  if (tls_ && tls_->has_buffered()) return true;
  pollfd p{.fd = fd_, .events = POLLIN | POLLRDHUP, .revents = 0};
  return ::poll(&p, 1, 0) != 0;  // ready, error or hang-up (or a poll failure: drop it too)
}

void Socket::write_all(const std::string& data, SocketClock::time_point deadline) {
  if (tls_) {
    try {
      tls_->write_all(data.data(), data.size(), deadline);
    } catch (const tls::Failure& failure) {
      throw SocketFailure{failure.timed_out, failure.what()};
    }
    return;
  }
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_ready(fd_, POLLOUT, deadline);
    } else if (errno != EINTR) {
      throw SocketFailure{false, "send: " + errno_text(errno)};
    }
  }
}

void Socket::read_exact(uint8_t* out, size_t size, SocketClock::time_point deadline) {
  if (tls_) {
    try {
      tls_->read_exact(out, size, deadline);
    } catch (const tls::Failure& failure) {
      throw SocketFailure{failure.timed_out, failure.what()};
    }
    return;
  }
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::recv(fd_, out + done, size - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n == 0) {
      throw SocketFailure{false, "the server closed the connection"};
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_ready(fd_, POLLIN, deadline);
    } else if (errno != EINTR) {
      throw SocketFailure{false, "recv: " + errno_text(errno)};
    }
  }
}

void Socket::read_frame(google::protobuf::MessageLite& message, size_t max_bytes,
                        SocketClock::time_point deadline) {
  uint8_t header[kFrameHeaderBytes];
  read_exact(header, kFrameHeaderBytes, deadline);
  const uint32_t length = decode_frame_header(header);
  if (length > max_bytes) {
    throw SocketFailure{false, "reply frame of " + std::to_string(length) + " bytes exceeds " +
                                   std::to_string(max_bytes)};
  }
  std::string body(length, '\0');
  read_exact(reinterpret_cast<uint8_t*>(body.data()), length, deadline);
  if (!message.ParseFromString(body)) throw SocketFailure{false, "malformed reply frame"};
}

}  // namespace hsgd::comm
