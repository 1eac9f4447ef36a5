#include "comm/transport/tls_device.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "comm/error.h"
#include "comm/log.h"
#include "comm/transport/detail/sockaddr_text.h"
#include "comm/transport/detail/tls_context.h"
#include "comm/transport/detail/tls_device_impl.h"
#include "comm/transport/detail/tls_pair.h"
#include "comm/transport/detail/tls_socket.h"

namespace hsgd::comm::transport {
namespace detail {

TlsDevice::TlsDevice(TlsDeviceOptions options)
    : options_(std::move(options)), bus_id_(), client_context_(tls::Context::client()) {
  HSGD_CHECK(!options_.token.empty(), "TLS transport of job '", options_.job_id,
             "': the token is empty; the data plane needs the job's token to key its connections");
  server_context_ =
      tls::Context::server([this](std::string_view identity) { return lookup(identity); });
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
  addrinfo* result = nullptr;
  const int rc = ::getaddrinfo(options_.host.c_str(), "0", &hints, &result);
  HSGD_CHECK(rc == 0, "TLS transport: host '", options_.host,
             "' is not a numeric address: ", ::gai_strerror(rc));
  listen_fd_ = ::socket(result->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const bool ok = listen_fd_ >= 0 && ::bind(listen_fd_, result->ai_addr, result->ai_addrlen) == 0 &&
                  ::listen(listen_fd_, 128) == 0;
  const int error = errno;
  ::freeaddrinfo(result);
  if (!ok) {
    if (listen_fd_ >= 0) ::close(listen_fd_);
    HSGD_THROW(CommError, "TLS transport: cannot listen on ", options_.host, ": ",
               std::strerror(error));
  }
  socklen_t length = sizeof(listen_address_);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&listen_address_), &length);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  acceptor_ = std::thread([this] { accept_loop(); });
}

TlsDevice::~TlsDevice() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (Handshake& h : handshakes_) {
      if (!h.done) ::shutdown(h.fd, SHUT_RDWR);  // its handshake fails at once
    }
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  acceptor_.join();
  for (Handshake& h : handshakes_) h.thread.join();
  ::close(listen_fd_);
  ::close(wake_fd_);
}

std::string TlsDevice::str() const { return "hsgd tls " + sockaddr_text(listen_address_); }

std::shared_ptr<gloo::transport::Context> TlsDevice::createContext(int rank, int size) {
  return std::make_shared<TlsContext>(shared_from_this(), rank, size);
}

void TlsDevice::expect(uint64_t id, int rank, int peer, TlsPair* pair) {
  std::lock_guard<std::mutex> lock(mu_);
  expected_[id] = Expected{.rank = rank, .peer = peer, .pair = pair};
}

void TlsDevice::forget(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  expected_.erase(id);
}

std::optional<tls::Psk> TlsDevice::lookup(std::string_view identity) {
  const std::string prefix = tls::psk_identity("data", options_.job_id, "");
  if (identity.substr(0, prefix.size()) != prefix) return std::nullopt;
  const auto name = parse_connection_name(identity.substr(prefix.size()));
  if (!name) return std::nullopt;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = expected_.find(name->pair_id);
    if (it == expected_.end() || it->second.rank != name->to || it->second.peer != name->from) {
      return std::nullopt;
    }
  }
  return tls::derive_psk(options_.token, identity);
}

void TlsDevice::reap_finished() {
  for (auto it = handshakes_.begin(); it != handshakes_.end();) {
    if (it->done) {
      it->thread.join();
      it = handshakes_.erase(it);
    } else {
      ++it;
    }
  }
}

void TlsDevice::accept_loop() {
  block_sigpipe_in_this_thread();
  for (;;) {
    pollfd fds[2] = {{.fd = listen_fd_, .events = POLLIN, .revents = 0},
                     {.fd = wake_fd_, .events = POLLIN, .revents = 0}};
    if (::poll(fds, 2, 1000) < 0 && errno != EINTR) {
      logger()->error("TLS transport: poll on the listening socket failed: {}",
                      std::strerror(errno));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    reap_finished();
    if ((fds[0].revents & POLLIN) == 0) continue;
    sockaddr_storage peer{};
    socklen_t length = sizeof(peer);
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &length,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) continue;  // the client left already, or a transient error (EMFILE...)
    const std::string from = sockaddr_text(peer);
    if (static_cast<int>(handshakes_.size()) >= options_.max_handshakes) {
      logger()->warn("TLS transport: closed a connection from {}: {} handshakes in progress", from,
                     handshakes_.size());
      ::close(fd);
      continue;
    }
    Handshake& h = handshakes_.emplace_back();
    h.fd = fd;
    h.thread = std::thread([this, &h, fd, from] { handshake(&h, fd, from); });
  }
}

void TlsDevice::handshake(Handshake* self, int fd, const std::string& peer_address) {
  block_sigpipe_in_this_thread();
  std::string refused;
  std::unique_ptr<TlsSocket> socket;
  try {
    socket = std::make_unique<TlsSocket>(fd, server_context_, tls::Role::kServer);
    socket->handshake(tls::Clock::now() + options_.handshake_timeout);
  } catch (const std::exception& e) {
    refused = e.what();
  }
  {
    // The socket is closed under mu_, so that ~TlsDevice never shuts down a reused descriptor.
    std::lock_guard<std::mutex> lock(mu_);
    if (refused.empty()) {
      const std::string prefix = tls::psk_identity("data", options_.job_id, "");
      const std::string identity = socket->peer_identity();
      const auto name = parse_connection_name(std::string_view(identity).substr(prefix.size()));
      const auto it = name ? expected_.find(name->pair_id) : expected_.end();
      if (it != expected_.end() && it->second.pair->adopt(std::move(socket))) {
        expected_.erase(it);
      } else {
        refused = "its pair is connected already or gone (" + identity + ")";
      }
    }
    socket.reset();
    self->done = true;
  }
  if (!refused.empty()) {
    logger()->warn("TLS transport: refused a connection from {}: {}", peer_address, refused);
  }
}

}  // namespace detail

std::shared_ptr<gloo::transport::Device> create_tls_device(const TlsDeviceOptions& options) {
  return std::make_shared<detail::TlsDevice>(options);
}

std::optional<uint64_t> tls_bytes_written(const gloo::transport::Device& device) {
  const auto* tls = dynamic_cast<const detail::TlsDevice*>(&device);
  if (tls == nullptr) return std::nullopt;
  return tls->bytes_written();
}

}  // namespace hsgd::comm::transport
