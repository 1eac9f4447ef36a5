#include "comm/transport/detail/tls_context.h"

#include <gloo/common/error.h>

#include <algorithm>
#include <cstring>

#include "comm/transport/detail/tls_buffers.h"
#include "comm/transport/detail/tls_device_impl.h"
#include "comm/transport/detail/tls_pair.h"

namespace hsgd::comm::transport::detail {
namespace {

bool accepts(const std::vector<int>& ranks, int rank) {
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

std::string length_mismatch(int src, uint64_t tag, size_t sent, size_t expected) {
  return "rank " + std::to_string(src) + " sent " + std::to_string(sent) + " bytes for tag " +
         std::to_string(tag) + " to a receive of " + std::to_string(expected) + " bytes";
}

}  // namespace

TlsContext::TlsContext(std::shared_ptr<TlsDevice> device, int rank, int size)
    : gloo::transport::Context(rank, size), device_(std::move(device)) {
  pairs_.resize(static_cast<size_t>(size));
}

TlsContext::~TlsContext() {
  // The pairs' I/O threads call into this object: end them before its members go.
  for (auto& pair : pairs_) pair.reset();
}

std::unique_ptr<gloo::transport::Pair>& TlsContext::createPair(int peer) {
  GLOO_ENFORCE(peer >= 0 && peer < size && peer != rank, "TLS transport: rank ", rank,
               " cannot pair with rank ", peer, " in a context of ", size);
  pairs_[static_cast<size_t>(peer)] = std::make_unique<TlsPair>(*this, *device_, peer);
  return pairs_[static_cast<size_t>(peer)];
}

std::unique_ptr<gloo::transport::UnboundBuffer> TlsContext::createUnboundBuffer(void* ptr,
                                                                                size_t size) {
  return std::make_unique<TlsUnboundBuffer>(shared_from_this(), ptr, size);
}

TlsPair& TlsContext::pair(int peer) {
  if (peer < 0 || peer >= size || !pairs_[static_cast<size_t>(peer)]) {
    throw gloo::IoException("TLS transport: rank " + std::to_string(rank) +
                            " has no connection to rank " + std::to_string(peer) + " (context of " +
                            std::to_string(size) + " ranks)");
  }
  return static_cast<TlsPair&>(*pairs_[static_cast<size_t>(peer)]);
}

TlsContext::Arrival TlsContext::arrive(int src, uint64_t tag, size_t length) {
  std::lock_guard<std::mutex> lock(match_mu_);
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if (it->tag != tag || !accepts(it->ranks, src)) continue;
    Arrival arrival{
        .target = it->target, .buffer = it->buffer, .kept = nullptr, .tag = tag, .error = {}};
    if (it->nbytes != length) {
      arrival.error = length_mismatch(src, tag, length, it->nbytes);
      it->buffer->fail(arrival.error);
    }
    posted_.erase(it);
    return arrival;
  }
  Kept& kept = kept_.emplace_back(Kept{.src = src, .tag = tag, .data = std::vector<char>(length)});
  return Arrival{
      .target = kept.data.data(), .buffer = nullptr, .kept = &kept, .tag = tag, .error = {}};
}

void TlsContext::arrived(int src, const Arrival& arrival) {
  if (arrival.buffer != nullptr) {
    arrival.buffer->recv_done(src);
    pair(src).acknowledge(arrival.tag);
    return;
  }
  std::lock_guard<std::mutex> lock(match_mu_);
  auto it =
      std::find_if(kept_.begin(), kept_.end(), [&](const Kept& k) { return &k == arrival.kept; });
  if (it == kept_.end()) return;
  if (it->claimed_by == nullptr) {
    it->complete = true;
    return;
  }
  if (!it->data.empty()) std::memcpy(it->claimed_target, it->data.data(), it->data.size());
  it->claimed_by->recv_done(src);
  const uint64_t tag = it->tag;
  kept_.erase(it);
  pair(src).acknowledge(tag);
}

void TlsContext::post_recv(TlsUnboundBuffer* buffer, const std::vector<int>& ranks, uint64_t tag,
                           char* target, size_t nbytes) {
  for (int src : ranks) pair(src);  // throws for a rank without a pair
  std::unique_lock<std::mutex> lock(match_mu_);
  for (auto it = kept_.begin(); it != kept_.end(); ++it) {
    if (it->tag != tag || it->claimed_by != nullptr || !accepts(ranks, it->src)) continue;
    if (it->data.size() != nbytes) {
      const std::string why = length_mismatch(it->src, tag, it->data.size(), nbytes);
      lock.unlock();
      buffer->fail(why);
      return;
    }
    if (!it->complete) {  // still arriving: delivered by arrived(), unless its pair failed
      if (std::string why = pair(it->src).failure(); !why.empty()) {
        lock.unlock();
        buffer->fail(why);
        return;
      }
      it->claimed_by = buffer;
      it->claimed_target = target;
      return;
    }
    const int src = it->src;
    if (nbytes > 0) std::memcpy(target, it->data.data(), nbytes);
    kept_.erase(it);
    lock.unlock();
    buffer->recv_done(src);
    pair(src).acknowledge(tag);
    return;
  }
  // No message kept, and a pair that failed before this receive was posted: fail_rank() ran
  // already, and nothing more comes from that rank. (Checked under match_mu_: fail() records the
  // failure before fail_rank() takes match_mu_, so a receive is either failed here or found
  // there. A message that arrived before the failure was taken above.)
  for (int src : ranks) {
    if (std::string why = pair(src).failure(); !why.empty()) {
      lock.unlock();
      buffer->fail(why);
      return;
    }
  }
  posted_.push_back(
      Posted{.buffer = buffer, .ranks = ranks, .tag = tag, .target = target, .nbytes = nbytes});
}

void TlsContext::fail_rank(int failed, const std::string& why) {
  // The buffers are failed under match_mu_: a buffer being destroyed waits in forget() (which
  // takes match_mu_) until this is done with it, so none is failed after its owner freed it.
  std::lock_guard<std::mutex> lock(match_mu_);
  std::vector<TlsUnboundBuffer*> to_fail;
  for (auto it = posted_.begin(); it != posted_.end();) {
    if (accepts(it->ranks, failed)) {
      to_fail.push_back(it->buffer);
      it = posted_.erase(it);
    } else {
      ++it;
    }
  }
  for (Kept& kept : kept_) {
    if (kept.src == failed && !kept.complete && kept.claimed_by != nullptr) {
      to_fail.push_back(kept.claimed_by);
      kept.claimed_by = nullptr;
    }
  }
  for (TlsUnboundBuffer* buffer : to_fail) buffer->fail(why);
}

void TlsContext::forget(TlsUnboundBuffer* buffer) {
  {
    std::lock_guard<std::mutex> lock(match_mu_);
    posted_.remove_if([&](const Posted& p) { return p.buffer == buffer; });
    for (Kept& kept : kept_) {
      if (kept.claimed_by == buffer) kept.claimed_by = nullptr;
    }
  }
  for (auto& pair : pairs_) {
    if (pair) static_cast<TlsPair&>(*pair).forget(buffer);
  }
}

}  // namespace hsgd::comm::transport::detail
