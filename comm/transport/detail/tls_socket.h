#pragma once
// TlsSocket: a TLS 1.3 connection (comm/tls's keys and configuration) over a non-blocking socket
// that it owns, for an event loop: after a blocking handshake with a deadline, reads and writes
// never wait and say when the socket must become readable or writable. tls::Stream blocks in
// every call, which a loop that reads and writes one connection at once cannot use (both ends
// writing a large message would wait for each other forever).
//
// Contract: one thread at a time calls handshake(), read_some() and write_some() (OpenSSL's SSL
// object is not shared between threads); shutdown() may be called from any thread and makes the
// other calls fail promptly. Errors are tls::Failure.
//
// Usage (fd: a connected non-blocking socket):
//   namespace tls = hsgd::comm::tls;
//   int fd = -1;
//   const std::string token = "the job token";
//   const std::string identity = tls::psk_identity("data", "job42", "0 -> 1 7");
//   hsgd::comm::transport::detail::TlsSocket socket(fd, tls::Context::client(),
//                                                   tls::Role::kClient);
//   socket.set_client_psk(identity, tls::derive_psk(token, identity));
//   socket.handshake(tls::Clock::now() + std::chrono::seconds(10));
//   size_t n = socket.write_some("hello", 5);  // 0: poll for socket.wants() first

#include <poll.h>
#include <signal.h>

#include <memory>
#include <string>

#include "comm/tls/tls.h"

namespace hsgd::comm::transport::detail {

// OpenSSL writes with write(2), which raises SIGPIPE when the peer is gone and kills a process
// that did not ignore it, so a peer (or an outsider) that closes at the right moment could kill
// the job. Threads of the transport block SIGPIPE for their whole life (a blocked thread-directed
// SIGPIPE stays pending and vanishes with the thread); the one handshake on a caller's thread
// runs under ScopedSigpipeBlock, which also discards the SIGPIPE it raised.
void block_sigpipe_in_this_thread();

class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock();
  ~ScopedSigpipeBlock();
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t previous_;
};

class TlsSocket {
 public:
  TlsSocket(int fd, std::shared_ptr<tls::Context> context, tls::Role role);
  ~TlsSocket();  // frees the SSL object and closes the socket
  TlsSocket(const TlsSocket&) = delete;
  TlsSocket& operator=(const TlsSocket&) = delete;

  void set_client_psk(std::string identity, const tls::Psk& psk);
  // Blocks until the handshake (and in certificate mode the identity exchange) completed or
  // failed; tls::Failure(timed_out) after deadline.
  void handshake(tls::Clock::time_point deadline);
  // The identity the client proved (server side, after the handshake).
  const std::string& peer_identity() const { return keys_.authenticated_identity; }

  // Decrypts at most size bytes into out; 0 when none are available now. Throws tls::Failure
  // when the peer closed the connection or the connection failed.
  size_t read_some(void* out, size_t size);
  // Encrypts and sends at most size bytes; 0 when the socket cannot take more now.
  size_t write_some(const void* data, size_t size);
  // True when decrypted bytes wait inside OpenSSL (poll() does not see them).
  bool has_buffered() const { return SSL_pending(ssl_) > 0; }
  // The poll events the last would-block call waits for (POLLIN or POLLOUT).
  short wants_for_read() const { return read_wants_; }
  short wants_for_write() const { return write_wants_; }
  // Shuts the socket down (both directions): the peer reads end-of-file, our calls fail.
  void shutdown();
  int fd() const { return fd_; }

 private:
  // Polls for events until deadline; tls::Failure(timed_out) when none came.
  void wait(short events, tls::Clock::time_point deadline, const char* what);
  // Runs op once; returns its byte count, or 0 and records what to wait for in *wants.
  size_t step(const char* what, short* wants, int rc, size_t done);

  const int fd_;
  const std::shared_ptr<tls::Context> context_;
  SSL* ssl_;
  tls::ConnectionKeys keys_;
  short read_wants_ = POLLIN;
  short write_wants_ = POLLOUT;
};

}  // namespace hsgd::comm::transport::detail
