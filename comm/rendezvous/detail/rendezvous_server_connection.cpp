// RendezvousServer::Impl::Connection: one client connection (see rendezvous_server_impl.h).

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "comm/error.h"
#include "comm/log.h"
#include "comm/rendezvous/detail/rendezvous_server_impl.h"

namespace hsgd::comm {

using asio::ip::tcp;
using boost::system::error_code;

namespace {

std::string to_string(const tcp::endpoint& endpoint) {
  const auto address = endpoint.address();
  const std::string host = address.is_v6() ? "[" + address.to_string() + "]" : address.to_string();
  return host + ":" + std::to_string(endpoint.port());
}

}  // namespace

RendezvousServer::Impl::Connection::Connection(Impl& server, tcp::socket socket)
    : server_(server), socket_(std::move(socket)), decoder_(server.options_.max_handshake_bytes) {
  error_code ec;
  const auto remote = socket_.remote_endpoint(ec);
  peer_ = ec ? std::string("unknown peer") : to_string(remote);
  // Reads are done by hand after the socket became readable (on_readable); they must not block.
  socket_.non_blocking(true, ec);
}

void RendezvousServer::Impl::Connection::start() {
  // Runs on the strand, like every other handler of this connection.
  std::weak_ptr<Connection> weak = weak_from_this();
  session_.emplace(server_.options_, server_.state_, socket_.get_executor(),
                   [weak](const RendezvousAnswer& answer) {
                     if (auto self = weak.lock()) self->send(answer);
                   });
  hello_timer_.expires_after(server_.options_.handshake_timeout);
  hello_timer_.async_wait([self = shared_from_this()](error_code ec) {
    if (ec || self->handshake_done_ || self->closed_) return;
    if (auto held_back = self->server_.tls_log_.allow()) {
      logger()->warn("rendezvous: {} completed no handshake within {} ms; closing it{}",
                     self->peer_, self->server_.options_.handshake_timeout.count(),
                     held_back_note(*held_back));
    }
    self->close("handshake timeout");
  });
  if (server_.tls_) {
    wait_first_byte();
  } else {
    wait_readable();
  }
}

void RendezvousServer::Impl::Connection::wait_first_byte() {
  socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) {
    if (self->closed_) return;
    if (ec) return self->close(ec.message().c_str());
    uint8_t first = 0;
    const ssize_t n = ::recv(self->socket_.native_handle(), &first, 1, MSG_PEEK);
    if (n == 0) return self->close("peer closed");
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return self->wait_first_byte();
      return self->close(std::strerror(errno));
    }
    // A TLS record of type handshake starts with 22. A plain frame starts with the high byte of
    // its length, which 22 would make 352 MiB: no Hello is that long, so the byte tells them
    // apart. A plain client (an older hsgd, or one started insecure) is told why in its own
    // framing; what it sent is dropped first, so that closing does not reset the reply away.
    if (first != 22) {
      char drain[4096];
      while (::recv(self->socket_.native_handle(), drain, sizeof(drain), MSG_DONTWAIT) > 0) {
      }
      return self->refuse(
          "", RendezvousSession::refusal(
                  "this server accepts only TLS 1.3 connections keyed by the job's token "
                  "(protocol version " +
                  std::to_string(kProtocolVersion) +
                  "); this client speaks plain TCP: update it, or run the server insecure"));
    }
    self->start_tls();
  });
}

void RendezvousServer::Impl::Connection::start_tls() {
  tls_ = std::make_unique<asio::ssl::stream<tcp::socket&>>(socket_, *server_.ssl_context_);
  tls::attach(tls_->native_handle(), &keys_);
  tls_->async_handshake(asio::ssl::stream_base::server, [self = shared_from_this()](error_code ec) {
    if (self->closed_) return;
    if (ec) {
      // Random bytes, a wrong token, a job without a token: nothing of it reached a job.
      if (auto held_back = self->server_.tls_log_.allow()) {
        logger()->warn("rendezvous: TLS handshake with {} failed ({}); closing it{}", self->peer_,
                       ec.message(), held_back_note(*held_back));
      }
      return self->close("TLS handshake failed");
    }
    if (self->server_.tls_->uses_certificates()) return self->read_identity_claim();
    self->on_tls_identity();
  });
}

void RendezvousServer::Impl::Connection::read_identity_claim() {
  claim_.assign(2, 0);
  asio::async_read(*tls_, asio::buffer(claim_), [self = shared_from_this()](error_code ec, size_t) {
    if (self->closed_) return;
    if (ec) return self->close("no identity claim after the TLS handshake");
    size_t length = 0;
    try {
      length = tls::claimed_identity_bytes(self->claim_.data());
    } catch (const tls::Failure& failure) {
      return self->refuse_identity(failure.what());
    }
    self->claim_.resize(2 + length + sizeof(tls::Proof));
    asio::async_read(
        *self->tls_, asio::buffer(self->claim_.data() + 2, length + sizeof(tls::Proof)),
        [self, length](error_code ec, size_t) {
          if (self->closed_) return;
          if (ec) return self->close("an incomplete identity claim after the TLS handshake");
          const std::string identity(reinterpret_cast<const char*>(self->claim_.data() + 2),
                                     length);
          tls::Proof proof{};
          std::copy_n(self->claim_.data() + 2 + length, proof.size(), proof.begin());
          std::string why;
          self->answer_ = tls::answer_identity_claim(self->tls_->native_handle(),
                                                     *self->server_.tls_, identity, proof,
                                                     &self->keys_, &why);
          asio::async_write(*self->tls_, asio::buffer(self->answer_),
                            [self, why](error_code ec, size_t) {
                              if (self->closed_) return;
                              if (!why.empty()) return self->refuse_identity(why);
                              if (ec) return self->close(ec.message().c_str());
                              self->on_tls_identity();
                            });
        });
  });
}

void RendezvousServer::Impl::Connection::refuse_identity(const std::string& why) {
  if (auto held_back = server_.tls_log_.allow()) {
    logger()->warn("rendezvous: refused {} after its TLS handshake: {}; closing it{}", peer_, why,
                   held_back_note(*held_back));
  }
  close("identity claim refused");
}

void RendezvousServer::Impl::Connection::on_tls_identity() {
  const std::optional<std::string> job = tls::identity_job(keys_.authenticated_identity);
  if (!job) return close("TLS identity without a job");  // the key lookup needed one
  session_->set_proven_job(*job);
  tls_up_ = true;
  read_tls();
}

void RendezvousServer::Impl::Connection::read_tls() {
  if (closed_ || close_after_write_) return;
  const size_t n = std::min(kTlsReadChunk, decoder_.wanted());
  if (!handshake_done_) {
    if (!server_.reserve_unauthenticated(n)) {
      refuse("", RendezvousSession::refusal(
                     "the server holds too many incomplete handshakes; try again"));
      return;
    }
    unauthenticated_held_ += n;
  }
  auto space = decoder_.prepare(n);
  tls_->async_read_some(asio::buffer(space.data(), space.size()), [self = shared_from_this(), n](
                                                                      error_code ec, size_t got) {
    if (self->closed_) return;
    self->decoder_.commit(got);
    if (!self->handshake_done_) {
      self->server_.release_unauthenticated(n - got);
      self->unauthenticated_held_ -= n - got;
    }
    if (ec) {
      return self->close(ec == asio::error::eof || ec == asio::ssl::error::stream_truncated
                             ? "peer closed"
                             : ec.message().c_str());
    }
    if (self->on_bytes()) self->read_tls();
  });
}

bool RendezvousServer::Impl::Connection::on_bytes() {
  switch (decoder_.state()) {
    case FrameDecoder::State::kOversized:
      on_oversized();
      return false;
    case FrameDecoder::State::kFrame:
      if (!on_frame()) return false;
      decoder_.next();
      return true;
    case FrameDecoder::State::kNeedMore:
      return true;
  }
  return true;
}

void RendezvousServer::Impl::Connection::send(const google::protobuf::MessageLite& message) {
  post_write({.head = encode_frame(message, server_.options_.max_frame_bytes, "rendezvous reply"),
              .tail = {}});
}

void RendezvousServer::Impl::Connection::send(const RendezvousAnswer& answer) {
  const size_t max_frame_bytes = server_.options_.max_frame_bytes;
  OutFrame frame;
  try {
    frame.head = encode_frame_head(answer.response, answer.shared ? answer.shared->size() : 0,
                                   max_frame_bytes, "rendezvous reply");
    frame.tail = answer.shared;
  } catch (const Error& e) {
    // A reply larger than the frame limit (e.g. a huge multi_get): the client could not read
    // it either, so report it instead.
    proto::Response error;
    error.set_id(answer.response.id());
    error.set_status(proto::STATUS_INVALID_ARGUMENT);
    error.set_error(e.what());
    frame = {.head = encode_frame(error, max_frame_bytes, "rendezvous reply"), .tail = {}};
  }
  post_write(std::move(frame));
}

void RendezvousServer::Impl::Connection::post_write(OutFrame frame) {
  asio::post(socket_.get_executor(),
             [self = shared_from_this(), frame = std::move(frame)]() mutable {
               self->queue_write(std::move(frame));
             });
}

void RendezvousServer::Impl::Connection::close(const char* why) {
  if (closed_) return;
  closed_ = true;
  logger()->debug("rendezvous: closing connection from {} (job '{}'): {}", peer_,
                  printable_excerpt(job_), why);
  error_code ec;
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  hello_timer_.cancel();
  release_unauthenticated();
  for (auto& weak : waiters_) {
    if (auto waiter = weak.lock()) server_.state_.drop(waiter);
  }
  waiters_.clear();
  if (session_) session_->on_close();
  server_.remove(this, handshake_done_ ? &job_ : nullptr);
}

void RendezvousServer::Impl::Connection::wait_readable() {
  socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) {
    if (self->closed_) return;
    if (ec) return self->close(ec.message().c_str());
    self->on_readable();
  });
}

void RendezvousServer::Impl::Connection::on_readable() {
  size_t budget = kReadBudget;
  bool first = true;
  while (!closed_ && !close_after_write_) {
    error_code ec;
    const size_t available = socket_.available(ec);
    if (ec) return close(ec.message().c_str());
    // Readable with nothing to read means end of stream or an error: one read tells which.
    if (available == 0 && !first) return wait_readable();
    first = false;
    const size_t n = std::min(std::max<size_t>(available, 1), decoder_.wanted());
    if (!handshake_done_) {
      if (!server_.reserve_unauthenticated(n)) {
        return refuse("", RendezvousSession::refusal(
                              "the server holds too many incomplete handshakes; try again"));
      }
      unauthenticated_held_ += n;
    }
    auto space = decoder_.prepare(n);
    const size_t got = socket_.read_some(asio::buffer(space.data(), space.size()), ec);
    decoder_.commit(got);
    if (!handshake_done_) {
      server_.release_unauthenticated(n - got);
      unauthenticated_held_ -= n - got;
    }
    if (ec == asio::error::would_block || ec == asio::error::try_again) return wait_readable();
    if (ec) return close(ec == asio::error::eof ? "peer closed" : ec.message().c_str());
    if (!on_bytes()) return;
    budget -= std::min(budget, got);
    if (budget == 0) {
      // Yield to the other connections of this thread; continue in a fresh handler.
      asio::post(socket_.get_executor(), [self = shared_from_this()] {
        if (!self->closed_) self->on_readable();
      });
      return;
    }
  }
}

void RendezvousServer::Impl::Connection::on_oversized() {
  const size_t length = decoder_.announced();
  // 16 03 ..: the start of a TLS record read as a length, a TLS client of this plain server.
  if (!handshake_done_ && !tls_up_ && (length >> 16) == 0x1603) {
    return refuse("", RendezvousSession::refusal(
                          "a TLS client reached this insecure (plain TCP) server: give both "
                          "sides the job's token, or run the client insecure too"));
  }
  if (!handshake_done_) {
    return refuse("",
                  RendezvousSession::refusal("a handshake frame of " + std::to_string(length) +
                                             " bytes exceeds the limit of " +
                                             std::to_string(server_.options_.max_handshake_bytes) +
                                             " bytes before the handshake"));
  }
  if (auto held_back = server_.request_log_.allow()) {
    logger()->warn("rendezvous: {} (job '{}') sent a frame of {} bytes (limit {}); closing it{}",
                   peer_, printable_excerpt(job_), length, server_.options_.max_frame_bytes,
                   held_back_note(*held_back));
  }
  close("oversized frame");
}

bool RendezvousServer::Impl::Connection::on_frame() {
  const bool was_handshake = !handshake_done_;
  auto step = session_->on_frame(decoder_.frame());
  if (was_handshake) release_unauthenticated();  // the Hello is parsed: its bytes are dropped
  using Kind = RendezvousSession::Step::Kind;
  if (step.kind == Kind::kRefused) {
    refuse(session_->claimed_job(), *step.hello_reply);
    return false;  // stop reading; the socket closes once the refusal is written
  }
  if (step.kind == Kind::kMalformed) {
    if (auto held_back = server_.request_log_.allow()) {
      logger()->warn("rendezvous: malformed request frame ({} bytes) from {} (job '{}'); closing{}",
                     decoder_.frame().size(), peer_, job_, held_back_note(*held_back));
    }
    close("malformed frame");
    return false;
  }
  if (step.hello_reply) {
    handshake_done_ = true;
    job_ = session_->job();
    decoder_.set_limit(server_.options_.max_frame_bytes);
    hello_timer_.cancel();
    server_.joined(job_, peer_);
    send(*step.hello_reply);
    return true;
  }
  if (step.answer) {
    const proto::Response& response = step.answer->response;
    if (response.status() == proto::STATUS_INVALID_ARGUMENT) {
      if (auto held_back = server_.request_log_.allow()) {
        logger()->warn("rendezvous: invalid request from {} (job '{}'): {}{}", peer_, job_,
                       printable_excerpt(response.error(), 300), held_back_note(*held_back));
      }
    }
    send(*step.answer);
  } else if (step.waiter) {
    // Forget waiters already answered, so that a long-lived connection does not grow.
    if (waiters_.size() >= 2 * live_waiters_hint_ + 16) {
      std::erase_if(waiters_, [](const auto& w) { return w.expired(); });
      live_waiters_hint_ = waiters_.size();
    }
    waiters_.push_back(std::move(step.waiter));
  }
  return true;
}

void RendezvousServer::Impl::Connection::refuse(const std::string& job,
                                                const proto::HelloReply& reply) {
  if (auto held_back = server_.refusal_log_.allow()) {
    logger()->warn("rendezvous: refused {} (job '{}'): {}{}", peer_, printable_excerpt(job),
                   reply.error(), held_back_note(*held_back));
  }
  release_unauthenticated();
  close_after_write_ = true;
  send(reply);
}

void RendezvousServer::Impl::Connection::release_unauthenticated() {
  server_.release_unauthenticated(unauthenticated_held_);
  unauthenticated_held_ = 0;
}

void RendezvousServer::Impl::Connection::queue_write(OutFrame frame) {
  if (closed_) return;
  queued_bytes_ += frame.size();
  // A client that keeps sending without reading its replies would grow this queue without
  // bound; cut it off instead. (A shared tail counts in full: it is what the client owes.)
  if (queued_bytes_ > 4 * server_.options_.max_frame_bytes + (1 << 20)) {
    logger()->warn("rendezvous: {} does not read its replies ({} bytes queued); closing", peer_,
                   queued_bytes_);
    return close("reply queue overflow");
  }
  writes_.push_back(std::move(frame));
  if (writes_.size() == 1) write_next();
}

void RendezvousServer::Impl::Connection::write_next() {
  const OutFrame& frame = writes_.front();
  const std::array<asio::const_buffer, 2> buffers = {
      asio::buffer(frame.head), frame.tail ? asio::buffer(*frame.tail) : asio::const_buffer()};
  auto on_written = [self = shared_from_this()](error_code ec, size_t) {
    if (ec) return self->close(ec.message().c_str());
    self->queued_bytes_ -= self->writes_.front().size();
    self->writes_.pop_front();
    if (!self->writes_.empty()) {
      self->write_next();
    } else if (self->close_after_write_) {
      self->close("handshake refused");
    }
  };
  if (tls_up_) {
    asio::async_write(*tls_, buffers, std::move(on_written));
  } else {
    asio::async_write(socket_, buffers, std::move(on_written));
  }
}

}  // namespace hsgd::comm
