// TlsPair's I/O thread: the one user of the pair's SSL object once connected (see tls_pair.h).
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "comm/transport/detail/tls_buffers.h"
#include "comm/transport/detail/tls_context.h"
#include "comm/transport/detail/tls_device_impl.h"
#include "comm/transport/detail/tls_pair.h"

namespace hsgd::comm::transport::detail {

void TlsPair::run() {
  block_sigpipe_in_this_thread();
  std::string why;
  try {
    for (;;) {
      write_ready();
      read_ready();
      bool has_output = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (closed_ || !error_.empty()) break;
        has_output = writing_ || !outgoing_.empty();
      }
      short events = socket_->wants_for_read();
      if (has_output) events |= socket_->wants_for_write();
      pollfd fds[2] = {{.fd = socket_->fd(), .events = events, .revents = 0},
                       {.fd = wake_fd_, .events = POLLIN, .revents = 0}};
      if (::poll(fds, 2, 1000) < 0 && errno != EINTR) {
        throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
      }
      if ((fds[1].revents & POLLIN) != 0) {
        uint64_t count = 0;
        [[maybe_unused]] ssize_t n = ::read(wake_fd_, &count, sizeof(count));
      }
    }
  } catch (const std::exception& e) {
    why = "TLS transport: the connection of rank " + std::to_string(context_.rank) + " to rank " +
          std::to_string(peer_) + " failed: " + e.what();
  }
  if (!why.empty()) fail(why);
  {
    std::lock_guard<std::mutex> lock(mu_);
    why = error_;
  }
  if (why.empty()) why = "TLS transport: the connection between " + describe() + " ended";
  // The operations in flight on this thread, which fail() does not see.
  if (writing_ && current_.unbound != nullptr) current_.unbound->fail(why);
  if (in_payload_ && in_arrival_.buffer != nullptr) in_arrival_.buffer->fail(why);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& entry : unacknowledged_) entry.second->fail(why);
  unacknowledged_.clear();
  io_running_ = false;
  write_owner_ = nullptr;
  read_owner_ = nullptr;
  cv_.notify_all();
}

void TlsPair::write_ready() {
  for (;;) {
    if (!writing_) {
      std::lock_guard<std::mutex> lock(mu_);
      if (outgoing_.empty()) return;
      // (bound and unbound are null for a message whose buffer is gone: it goes from a copy)
      current_ = outgoing_.front();
      outgoing_.pop_front();
      write_owner_ = current_.bound != nullptr ? static_cast<const void*>(current_.bound)
                                               : static_cast<const void*>(current_.unbound);
      writing_ = true;
      current_done_ = 0;
    }
    constexpr size_t kHeader = sizeof(FrameHeader);
    const size_t total = kHeader + current_.header.length;
    if (current_done_ == 0 && total <= kCoalesceBytes) {
      // A small message goes out as one TLS record (one segment) instead of two.
      staged_.resize(total);
      std::memcpy(staged_.data(), &current_.header, kHeader);
      if (current_.header.length > 0) {
        std::memcpy(staged_.data() + kHeader, current_.data, current_.header.length);
      }
    }
    while (current_done_ < total) {
      const char* data = total <= kCoalesceBytes ? staged_.data() + current_done_
                         : current_done_ < kHeader
                             ? reinterpret_cast<const char*>(&current_.header) + current_done_
                             : current_.data + (current_done_ - kHeader);
      const size_t size = total <= kCoalesceBytes || current_done_ >= kHeader
                              ? total - current_done_
                              : kHeader - current_done_;
      const size_t written = socket_->write_some(data, size);
      if (written == 0) return;  // the socket is full: poll for POLLOUT
      current_done_ += written;
      bytes_written_.fetch_add(written, std::memory_order_relaxed);
      device_.count_written(written);
    }
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    write_owner_ = nullptr;
    if (current_.bound != nullptr) ++current_.bound->sends_done_;
    if (current_.unbound != nullptr && !error_.empty()) {
      current_.unbound->fail(error_);  // failed meanwhile (close()): no acknowledgement comes
    } else if (current_.unbound != nullptr) {
      unacknowledged_.emplace_back(current_.header.slot, current_.unbound);
    }
    current_ = {};
    cv_.notify_all();
  }
}

void TlsPair::read_ready() {
  // Returns after at most this many bytes, so that writes are not starved by a fast sender.
  constexpr size_t kBudget = size_t{4} << 20;
  size_t budget = kBudget;
  while (budget > 0) {
    if (!in_payload_) {
      const size_t got = socket_->read_some(reinterpret_cast<char*>(&in_) + in_header_got_,
                                            sizeof(in_) - in_header_got_);
      if (got == 0) return;
      in_header_got_ += got;
      if (in_header_got_ < sizeof(in_)) continue;
      in_header_got_ = 0;
      if (in_.kind == static_cast<uint32_t>(FrameKind::kAck)) {
        acknowledged(in_.slot);
        continue;
      }
      begin_payload();
      if (in_left_ == 0) end_payload();
      continue;
    }
    const size_t got = socket_->read_some(in_target_, std::min(in_left_, budget));
    if (got == 0) return;
    budget -= std::min(got, budget);
    in_target_ += got;
    in_left_ -= got;
    if (in_left_ == 0) end_payload();
  }
}

void TlsPair::acknowledged(uint64_t tag) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = std::find_if(unacknowledged_.begin(), unacknowledged_.end(),
                               [&](const auto& entry) { return entry.first == tag; });
  if (it == unacknowledged_.end()) return;  // its buffer is gone
  it->second->send_done(peer_);
  unacknowledged_.erase(it);
}

void TlsPair::begin_payload() {
  const std::string from = "rank " + std::to_string(peer_) + " sent ";
  in_left_ = in_.length;
  in_payload_ = true;
  if (in_.kind == static_cast<uint32_t>(FrameKind::kBuffer)) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = recv_buffers_.find(in_.slot);
    if (it == recv_buffers_.end()) {
      in_early_ = &early_[in_.slot].emplace_back(
          Early{.offset = in_.offset, .data = std::vector<char>(in_.length)});
      in_target_ = in_early_->data.data();
      return;
    }
    TlsBuffer& buffer = *it->second;
    if (in_.offset > buffer.size() || in_.length > buffer.size() - in_.offset) {
      throw std::runtime_error(from + std::to_string(in_.length) + " bytes at offset " +
                               std::to_string(in_.offset) + " for slot " +
                               std::to_string(in_.slot) + ", whose receive buffer holds " +
                               std::to_string(buffer.size()));
    }
    in_bound_ = &buffer;
    in_target_ = buffer.data() + in_.offset;
    read_owner_ = &buffer;
    return;
  }
  if (in_.kind == static_cast<uint32_t>(FrameKind::kUnbound)) {
    in_arrival_ = context_.arrive(peer_, in_.slot, in_.length);
    if (!in_arrival_.error.empty()) {
      in_arrival_.buffer = nullptr;  // failed already
      throw std::runtime_error(in_arrival_.error);
    }
    in_target_ = in_arrival_.target;
    std::lock_guard<std::mutex> lock(mu_);
    read_owner_ = in_arrival_.buffer;
    return;
  }
  throw std::runtime_error(from + "a frame of unknown kind " + std::to_string(in_.kind));
}

void TlsPair::end_payload() {
  in_payload_ = false;
  if (in_.kind == static_cast<uint32_t>(FrameKind::kUnbound)) {
    const TlsContext::Arrival arrival = std::move(in_arrival_);
    in_arrival_ = {};
    context_.arrived(peer_, arrival);  // before read_owner_ clears: forget() waits for it
    std::lock_guard<std::mutex> lock(mu_);
    read_owner_ = nullptr;
    cv_.notify_all();
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  read_owner_ = nullptr;
  if (in_bound_ != nullptr) {
    ++in_bound_->recvs_done_;
    in_bound_ = nullptr;
  } else {
    in_early_->complete = true;
    in_early_ = nullptr;
    deliver_early(in_.slot);
  }
  cv_.notify_all();
}

}  // namespace hsgd::comm::transport::detail
