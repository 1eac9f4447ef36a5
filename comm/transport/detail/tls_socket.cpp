#include "comm/transport/detail/tls_socket.h"

#include <openssl/err.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace hsgd::comm::transport::detail {
namespace {

int remaining_ms(tls::Clock::time_point deadline) {
  const auto left =
      std::chrono::ceil<std::chrono::milliseconds>(deadline - tls::Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

sigset_t sigpipe_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  return set;
}

}  // namespace

void block_sigpipe_in_this_thread() {
  const sigset_t set = sigpipe_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

ScopedSigpipeBlock::ScopedSigpipeBlock() {
  const sigset_t set = sigpipe_set();
  pthread_sigmask(SIG_BLOCK, &set, &previous_);
}

ScopedSigpipeBlock::~ScopedSigpipeBlock() {
  if (sigismember(&previous_, SIGPIPE) == 0) {
    // Discard a SIGPIPE raised meanwhile (a process-directed one pending from elsewhere would be
    // taken too; SIGPIPE is always raised for the writing thread).
    sigset_t pending;
    sigpending(&pending);
    if (sigismember(&pending, SIGPIPE) == 1) {
      const sigset_t set = sigpipe_set();
      const timespec zero{};
      sigtimedwait(&set, nullptr, &zero);
    }
  }
  pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

TlsSocket::TlsSocket(int fd, std::shared_ptr<tls::Context> context, tls::Role role)
    : fd_(fd), context_(std::move(context)), ssl_(SSL_new(context_->native())) {
  if (ssl_ == nullptr) {
    ::close(fd_);
    throw tls::Failure(false, "SSL_new: " + tls::openssl_errors());
  }
  tls::attach(ssl_, &keys_);
  SSL_set_mode(ssl_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_set_fd(ssl_, fd_) != 1) {
    SSL_free(ssl_);
    ::close(fd_);
    throw tls::Failure(false, "SSL_set_fd: " + tls::openssl_errors());
  }
  if (role == tls::Role::kClient) {
    SSL_set_connect_state(ssl_);
  } else {
    SSL_set_accept_state(ssl_);
  }
}

TlsSocket::~TlsSocket() {
  SSL_free(ssl_);
  ::close(fd_);
}

void TlsSocket::set_client_psk(std::string identity, const tls::Psk& psk) {
  keys_.client_identity = std::move(identity);
  keys_.client_psk = psk;
}

void TlsSocket::shutdown() { ::shutdown(fd_, SHUT_RDWR); }

size_t TlsSocket::step(const char* what, short* wants, int rc, size_t done) {
  if (rc > 0) return done;
  switch (SSL_get_error(ssl_, rc)) {
    case SSL_ERROR_WANT_READ:
      *wants = POLLIN;
      return 0;
    case SSL_ERROR_WANT_WRITE:
      *wants = POLLOUT;
      return 0;
    case SSL_ERROR_ZERO_RETURN:
      throw tls::Failure(false, std::string(what) + ": the peer closed the connection");
    case SSL_ERROR_SYSCALL: {
      const int error = errno;
      const std::string queued = tls::openssl_errors();
      throw tls::Failure(false, std::string(what) + ": " +
                                    (error != 0       ? std::strerror(error)
                                     : queued.empty() ? "the peer closed the connection"
                                                      : queued));
    }
    default: {
      const std::string queued = tls::openssl_errors();
      throw tls::Failure(false, std::string(what) + ": " + (queued.empty() ? "TLS error" : queued));
    }
  }
}

void TlsSocket::wait(short events, tls::Clock::time_point deadline, const char* what) {
  pollfd p{.fd = fd_, .events = events, .revents = 0};
  const int n = ::poll(&p, 1, remaining_ms(deadline));
  if (n == 0) throw tls::Failure(true, std::string(what) + ": no progress before the deadline");
  if (n < 0 && errno != EINTR) {
    throw tls::Failure(false, std::string(what) + ": poll: " + std::strerror(errno));
  }
}

void TlsSocket::handshake(tls::Clock::time_point deadline) {
  for (;;) {
    ERR_clear_error();
    errno = 0;
    short wants = POLLIN;
    try {
      if (step("TLS handshake", &wants, SSL_do_handshake(ssl_), 1) > 0) break;
    } catch (const tls::Failure& failure) {
      throw tls::Failure(failure.timed_out,
                         tls::handshake_failure(ssl_, *context_, failure.what()));
    }
    wait(wants, deadline, "TLS handshake");
  }
  tls::check_key_used(ssl_, *context_);
  if (!context_->uses_certificates()) return;
  const auto write_all = [&](const void* data, size_t size) {
    const auto* bytes = static_cast<const uint8_t*>(data);
    for (size_t done = 0; done < size;) {
      const size_t n = write_some(bytes + done, size - done);
      if (n == 0) wait(write_wants_, deadline, "TLS identity exchange");
      done += n;
    }
  };
  const auto read_exact = [&](void* out, size_t size) {
    auto* bytes = static_cast<uint8_t*>(out);
    for (size_t done = 0; done < size;) {
      const size_t n = read_some(bytes + done, size - done);
      if (n == 0) wait(read_wants_, deadline, "TLS identity exchange");
      done += n;
    }
  };
  tls::exchange_identity_proofs(ssl_, *context_,
                                SSL_is_server(ssl_) == 1 ? tls::Role::kServer : tls::Role::kClient,
                                &keys_, write_all, read_exact);
}

size_t TlsSocket::read_some(void* out, size_t size) {
  ERR_clear_error();
  errno = 0;
  size_t got = 0;
  const int rc = SSL_read_ex(ssl_, out, size, &got);
  return step("TLS read", &read_wants_, rc, got);
}

size_t TlsSocket::write_some(const void* data, size_t size) {
  ERR_clear_error();
  errno = 0;
  size_t written = 0;
  const int rc = SSL_write_ex(ssl_, data, size, &written);
  return step("TLS write", &write_wants_, rc, written);
}

}  // namespace hsgd::comm::transport::detail
