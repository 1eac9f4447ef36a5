#include "comm/transport/detail/tls_buffers.h"

#include <gloo/common/error.h>

#include "comm/transport/detail/tls_context.h"
#include "comm/transport/detail/tls_pair.h"

namespace hsgd::comm::transport::detail {

TlsBuffer::TlsBuffer(TlsPair& pair, int slot, void* ptr, size_t size, bool recv)
    : gloo::transport::Buffer(slot, ptr, size), pair_(pair), recv_(recv) {}

TlsBuffer::~TlsBuffer() { pair_.unregister(*this); }

void TlsBuffer::send(size_t offset, size_t length, size_t roffset) {
  GLOO_ENFORCE(!recv_, "TLS transport: send on a receive buffer (slot ", slot_, ")");
  pair_.send_bound(*this, offset, length, roffset);
}

void TlsBuffer::waitRecv() { pair_.wait_recv(*this); }

void TlsBuffer::waitSend() { pair_.wait_send(*this); }

TlsUnboundBuffer::TlsUnboundBuffer(std::shared_ptr<TlsContext> context, void* ptr, size_t size)
    : gloo::transport::UnboundBuffer(ptr, size), context_(std::move(context)) {}

TlsUnboundBuffer::~TlsUnboundBuffer() { context_->forget(this); }

size_t TlsUnboundBuffer::checked_length(size_t offset, size_t nbytes, const char* what) const {
  if (nbytes == kUnspecifiedByteCount) nbytes = offset <= size ? size - offset : 0;
  GLOO_ENFORCE(offset <= size && nbytes <= size - offset, "TLS transport: ", what, " of ", nbytes,
               " bytes at offset ", offset, " of a buffer of ", size);
  return nbytes;
}

void TlsUnboundBuffer::send(int dst, uint64_t slot, size_t offset, size_t nbytes) {
  nbytes = checked_length(offset, nbytes, "send");
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_send_to_ = "rank " + std::to_string(dst) + " (tag " + std::to_string(slot) + ")";
  }
  context_->pair(dst).send_unbound(*this, slot, static_cast<const char*>(ptr) + offset, nbytes);
}

void TlsUnboundBuffer::recv(int src, uint64_t slot, size_t offset, size_t nbytes) {
  recv(std::vector<int>{src}, slot, offset, nbytes);
}

void TlsUnboundBuffer::recv(std::vector<int> srcs, uint64_t slot, size_t offset, size_t nbytes) {
  nbytes = checked_length(offset, nbytes, "receive");
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_recv_from_ = "rank";
    for (int src : srcs) last_recv_from_ += " " + std::to_string(src);
    last_recv_from_ += " (tag " + std::to_string(slot) + ")";
  }
  context_->post_recv(this, srcs, slot, static_cast<char*>(ptr) + offset, nbytes);
}

void TlsUnboundBuffer::recv_done(int src) {
  std::lock_guard<std::mutex> lock(mu_);
  recvs_done_.push_back(src);
  cv_.notify_all();
}

void TlsUnboundBuffer::send_done(int dst) {
  std::lock_guard<std::mutex> lock(mu_);
  sends_done_.push_back(dst);
  cv_.notify_all();
}

void TlsUnboundBuffer::fail(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.empty()) error_ = why;
  cv_.notify_all();
}

void TlsUnboundBuffer::abortWaitRecv() {
  std::lock_guard<std::mutex> lock(mu_);
  abort_recv_ = true;
  cv_.notify_all();
}

void TlsUnboundBuffer::abortWaitSend() {
  std::lock_guard<std::mutex> lock(mu_);
  abort_send_ = true;
  cv_.notify_all();
}

bool TlsUnboundBuffer::waitRecv(int* rank, std::chrono::milliseconds timeout) {
  return wait(recvs_done_, abort_recv_, rank, timeout, "a receive from ");
}

bool TlsUnboundBuffer::waitSend(int* rank, std::chrono::milliseconds timeout) {
  return wait(sends_done_, abort_send_, rank, timeout, "a send to ");
}

bool TlsUnboundBuffer::wait(std::deque<int>& done, bool& aborted, int* rank,
                            std::chrono::milliseconds timeout, const char* what) {
  if (timeout == gloo::transport::kUnsetTimeout) timeout = context_->getTimeout();
  std::unique_lock<std::mutex> lock(mu_);
  const bool ready = cv_.wait_until(lock, std::chrono::steady_clock::now() + timeout,
                                    [&] { return !done.empty() || aborted || !error_.empty(); });
  const std::string& peer = &done == &recvs_done_ ? last_recv_from_ : last_send_to_;
  if (!done.empty()) {
    if (rank != nullptr) *rank = done.front();
    done.pop_front();
    return true;
  }
  if (aborted) {
    aborted = false;
    return false;
  }
  if (!ready) {
    throw gloo::IoException("TLS transport: rank " + std::to_string(context_->rank) +
                            " timed out after " + std::to_string(timeout.count()) +
                            " ms waiting for " + what + peer);
  }
  throw gloo::IoException(error_ + " (rank " + std::to_string(context_->rank) + " waiting for " +
                          what + peer + ")");
}

}  // namespace hsgd::comm::transport::detail
