#include "comm/transport/detail/tls_pair.h"

#include <arpa/inet.h>
#include <gloo/common/error.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "comm/transport/detail/sockaddr_text.h"
#include "comm/transport/detail/tls_buffers.h"
#include "comm/transport/detail/tls_context.h"
#include "comm/transport/detail/tls_device_impl.h"

namespace hsgd::comm::transport::detail {
namespace {

WireAddress make_address(TlsDevice& device, int rank) {
  WireAddress wire;
  wire.rank = rank;
  wire.pair_id = device.next_pair_id();
  wire.listen = device.listen_address();
  return wire;
}

socklen_t sockaddr_length(const sockaddr_storage& address) {
  return address.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

// A TCP connection to address, retried until deadline; -1 with *error set when none was made.
int connect_tcp(const sockaddr_storage& address, tls::Clock::time_point deadline,
                std::string* error) {
  for (;;) {
    const int fd = ::socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *error = std::string("socket: ") + std::strerror(errno);
      return -1;
    }
    int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sockaddr_length(address));
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - tls::Clock::now());
      if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0))) == 1) {
        int so_error = 0;
        socklen_t length = sizeof(so_error);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &length);
        errno = so_error;
        rc = so_error == 0 ? 0 : -1;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return fd;
    }
    *error = std::strerror(errno);
    ::close(fd);
    if (tls::Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

std::string TlsAddress::str() const {
  return sockaddr_text(wire_.listen) + " rank " + std::to_string(wire_.rank) + " pair " +
         std::to_string(wire_.pair_id);
}

std::vector<char> TlsAddress::bytes() const {
  const auto* raw = reinterpret_cast<const char*>(&wire_);
  return std::vector<char>(raw, raw + sizeof(wire_));
}

TlsPair::TlsPair(TlsContext& context, TlsDevice& device, int peer)
    : context_(context),
      device_(device),
      peer_(peer),
      accepting_(peer < context.rank),
      address_(make_address(device, context.rank)),
      wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (accepting_) device_.expect(address_.wire().pair_id, context.rank, peer, this);
}

TlsPair::~TlsPair() {
  if (accepting_) device_.forget(address_.wire().pair_id);
  {
    // Messages already sent go out before the connection closes, as Gloo's TCP pairs write them
    // before send() returns: the ring's last notification must reach a slower peer after this
    // rank left. Bounded by the context timeout, and by kDrainStall without progress (a link
    // that is down would otherwise hold the process for the whole timeout).
    const auto deadline = std::chrono::steady_clock::now() + context_.getTimeout();
    const auto drained = [&] {
      return (outgoing_.empty() && !writing_) || !error_.empty() || !io_running_;
    };
    std::unique_lock<std::mutex> lock(mu_);
    uint64_t written = bytes_written_.load(std::memory_order_relaxed);
    auto stall_until = std::chrono::steady_clock::now() + kDrainStall;
    while (!drained()) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) break;
      if (const uint64_t w = bytes_written_.load(std::memory_order_relaxed); w != written) {
        written = w;
        stall_until = now + kDrainStall;
      } else if (now >= stall_until) {
        break;
      }
      cv_.wait_until(lock, std::min({deadline, stall_until, now + std::chrono::milliseconds(100)}));
    }
  }
  close();
  if (io_.joinable()) io_.join();
  ::close(wake_fd_);
}

int TlsPair::rank() const { return context_.rank; }

std::string TlsPair::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

std::string TlsPair::describe() const {
  return "rank " + std::to_string(context_.rank) + " and rank " + std::to_string(peer_);
}

void TlsPair::connect(const std::vector<char>& bytes) {
  WireAddress wire;
  GLOO_ENFORCE(bytes.size() == sizeof(wire), "TLS transport: rank ", context_.rank,
               " got an address of ", bytes.size(), " bytes for rank ", peer_);
  std::memcpy(&wire, bytes.data(), sizeof(wire));
  GLOO_ENFORCE(wire.magic == kAddressMagic && wire.rank == peer_, "TLS transport: rank ",
               context_.rank, " got an address of rank ", wire.rank, " (magic ", wire.magic,
               ") for its pair with rank ", peer_);
  const auto timeout = context_.getTimeout();
  const auto deadline = tls::Clock::now() + timeout;
  if (accepting_) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return socket_ != nullptr || closed_; })) {
      throw gloo::IoException("TLS transport: rank " + std::to_string(context_.rank) +
                              " timed out after " + std::to_string(timeout.count()) +
                              " ms waiting for rank " + std::to_string(peer_) + " to connect");
    }
    if (closed_) {
      throw gloo::IoException("TLS transport: the pair of " + describe() +
                              " was closed while it waited for rank " + std::to_string(peer_));
    }
  } else {
    std::string error;
    const int fd = connect_tcp(wire.listen, deadline, &error);
    if (fd < 0) {
      throw gloo::IoException("TLS transport: rank " + std::to_string(context_.rank) +
                              " cannot connect to rank " + std::to_string(peer_) + " at " +
                              sockaddr_text(wire.listen) + ": " + error);
    }
    auto socket = std::make_unique<TlsSocket>(fd, device_.client_context(), tls::Role::kClient);
    const std::string identity = tls::psk_identity(
        "data", device_.options().job_id, connection_name(context_.rank, peer_, wire.pair_id));
    socket->set_client_psk(identity, tls::derive_psk(device_.options().token, identity));
    try {
      ScopedSigpipeBlock no_sigpipe;
      socket->handshake(deadline);
    } catch (const tls::Failure& e) {
      throw gloo::IoException("TLS transport: rank " + std::to_string(context_.rank) +
                              " could not authenticate with rank " + std::to_string(peer_) +
                              " at " + sockaddr_text(wire.listen) + " (" + e.what() +
                              "; do both hold the job's token?)");
    }
    if (!adopt(std::move(socket))) {
      throw gloo::IoException("TLS transport: the pair of " + describe() +
                              " was closed while it connected");
    }
  }
}

bool TlsPair::adopt(std::unique_ptr<TlsSocket> socket) {
  std::lock_guard<std::mutex> lock(mu_);
  if (socket_ != nullptr || closed_) return false;
  socket_ = std::move(socket);
  const int one = 1;
  ::setsockopt(socket_->fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  io_running_ = true;
  io_ = std::thread([this] { run(); });
  cv_.notify_all();
  return true;
}

void TlsPair::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
  }
  // The reason is recorded before the I/O thread can see closed_ and end, so that the operations
  // it holds fail with it (an empty reason would wake no waiter).
  fail("the connection between " + describe() + " was closed by rank " +
       std::to_string(context_.rank));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (socket_ != nullptr) socket_->shutdown();
    cv_.notify_all();
  }
  wake();
}

void TlsPair::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

void TlsPair::fail(const std::string& why) {
  {
    // The buffers are failed under mu_: a buffer being destroyed waits in forget() (which takes
    // mu_) until this is done with it, so none is failed after its owner freed it.
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) return;
    error_ = why;
    std::deque<Outgoing> dropped;
    dropped.swap(outgoing_);
    for (const auto& [tag, buffer] : unacknowledged_)
      dropped.push_back(Outgoing{.unbound = buffer});
    unacknowledged_.clear();
    cv_.notify_all();  // bound buffers' waiters see error_
    for (const Outgoing& out : dropped) {
      if (out.unbound != nullptr) out.unbound->fail(why);
    }
  }
  context_.fail_rank(peer_, why);
}

// ---- buffers ----

void TlsPair::deliver_early(uint64_t slot) {
  const auto buffer = recv_buffers_.find(slot);
  const auto queue = early_.find(slot);
  if (buffer == recv_buffers_.end() || queue == early_.end()) return;
  TlsBuffer& target = *buffer->second;
  while (!queue->second.empty() && queue->second.front().complete) {
    const Early& early = queue->second.front();
    if (early.offset > target.size() || early.data.size() > target.size() - early.offset) {
      error_ = "TLS transport: rank " + std::to_string(peer_) + " sent " +
               std::to_string(early.data.size()) + " bytes at offset " +
               std::to_string(early.offset) + " for slot " + std::to_string(slot) +
               ", whose receive buffer holds " + std::to_string(target.size());
      return;
    }
    if (!early.data.empty()) {
      std::memcpy(target.data() + early.offset, early.data.data(), early.data.size());
    }
    ++target.recvs_done_;
    queue->second.pop_front();
  }
  if (queue->second.empty()) early_.erase(queue);
}

void TlsPair::register_recv(TlsBuffer& buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  recv_buffers_[static_cast<uint64_t>(buffer.slot())] = &buffer;
  deliver_early(static_cast<uint64_t>(buffer.slot()));
}

void TlsPair::unregister(TlsBuffer& buffer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = recv_buffers_.find(static_cast<uint64_t>(buffer.slot()));
    if (it != recv_buffers_.end() && it->second == &buffer) recv_buffers_.erase(it);
  }
  forget(&buffer);
}

void TlsPair::forget(const void* owner) {
  std::unique_lock<std::mutex> lock(mu_);
  // Gloo destroys buffers without waiting for every send (the ring's notifications): their
  // queued messages still go out, from a copy.
  for (Outgoing& out : outgoing_) {
    if (out.bound != owner && out.unbound != owner) continue;
    out.owned = std::make_shared<std::vector<char>>(out.data, out.data + out.header.length);
    out.data = out.owned->data();
    out.bound = nullptr;
    out.unbound = nullptr;
  }
  std::erase_if(unacknowledged_, [&](const auto& entry) { return entry.second == owner; });
  const auto idle = [&] { return (write_owner_ != owner && read_owner_ != owner) || !io_running_; };
  if (cv_.wait_until(lock, std::chrono::steady_clock::now() + context_.getTimeout(), idle)) return;
  // The I/O thread is still reading or writing the owner's memory: end the connection first.
  lock.unlock();
  close();
  lock.lock();
  cv_.wait(lock, [&] { return !io_running_; });
}

void TlsPair::send_bound(TlsBuffer& buffer, size_t offset, size_t length, size_t roffset) {
  GLOO_ENFORCE(offset <= buffer.size() && length <= buffer.size() - offset,
               "TLS transport: send of ", length, " bytes at offset ", offset, " from a buffer of ",
               buffer.size());
  FrameHeader header{.kind = static_cast<uint32_t>(FrameKind::kBuffer),
                     .slot = static_cast<uint64_t>(buffer.slot()),
                     .offset = roffset,
                     .length = length};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) throw gloo::IoException(error_);
    outgoing_.push_back(
        Outgoing{.header = header, .data = buffer.data() + offset, .bound = &buffer});
  }
  wake();
}

void TlsPair::send_unbound(TlsUnboundBuffer& buffer, uint64_t tag, const char* data,
                           size_t nbytes) {
  FrameHeader header{
      .kind = static_cast<uint32_t>(FrameKind::kUnbound), .slot = tag, .length = nbytes};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) throw gloo::IoException(error_);
    outgoing_.push_back(Outgoing{.header = header, .data = data, .unbound = &buffer});
  }
  wake();
}

void TlsPair::acknowledge(uint64_t tag) {
  FrameHeader header{.kind = static_cast<uint32_t>(FrameKind::kAck), .slot = tag};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) return;  // the sender fails anyway
    outgoing_.push_back(Outgoing{.header = header, .data = nullptr});
  }
  wake();
}

void TlsPair::wait_recv(TlsBuffer& buffer) { wait(buffer, true); }
void TlsPair::wait_send(TlsBuffer& buffer) { wait(buffer, false); }

void TlsPair::wait(TlsBuffer& buffer, bool recv) {
  const auto timeout = context_.getTimeout();
  std::unique_lock<std::mutex> lock(mu_);
  int& done = recv ? buffer.recvs_done_ : buffer.sends_done_;
  const std::string what = std::string(recv ? "receive from" : "send to") + " rank " +
                           std::to_string(peer_) + " (slot " + std::to_string(buffer.slot()) + ")";
  if (!cv_.wait_until(lock, std::chrono::steady_clock::now() + timeout,
                      [&] { return done > 0 || !error_.empty(); })) {
    throw gloo::IoException("TLS transport: rank " + std::to_string(context_.rank) +
                            " timed out after " + std::to_string(timeout.count()) +
                            " ms waiting for a " + what);
  }
  if (done > 0) {
    --done;
    return;
  }
  throw gloo::IoException(error_ + " (rank " + std::to_string(context_.rank) + " waiting for a " +
                          what + ")");
}

std::unique_ptr<gloo::transport::Buffer> TlsPair::createSendBuffer(int slot, void* ptr,
                                                                   size_t size) {
  return std::make_unique<TlsBuffer>(*this, slot, ptr, size, false);
}

std::unique_ptr<gloo::transport::Buffer> TlsPair::createRecvBuffer(int slot, void* ptr,
                                                                   size_t size) {
  auto buffer = std::make_unique<TlsBuffer>(*this, slot, ptr, size, true);
  register_recv(*buffer);
  return buffer;
}

void TlsPair::send(gloo::transport::UnboundBuffer* buffer, uint64_t tag, size_t offset,
                   size_t nbytes) {
  buffer->send(peer_, tag, offset, nbytes);
}

void TlsPair::recv(gloo::transport::UnboundBuffer* buffer, uint64_t tag, size_t offset,
                   size_t nbytes) {
  buffer->recv(peer_, tag, offset, nbytes);
}

}  // namespace hsgd::comm::transport::detail
