#include "comm/rendezvous_server.h"

#include <array>
#include <atomic>
#include <deque>
#include <fstream>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "comm/asio.h"
#include "comm/error.h"
#include "comm/frame.h"
#include "comm/log.h"
#include "comm/rendezvous_state.h"
#include "proto/rendezvous.pb.h"

namespace hsgd::comm {

using asio::ip::tcp;
using boost::system::error_code;

namespace {

// The kernel caps the listen backlog at somaxconn anyway; asking for exactly that lets a
// thousand ranks connect at once without SYN retries.
int listen_backlog() {
  std::ifstream in("/proc/sys/net/core/somaxconn");
  int value = 0;
  if (in >> value && value > 0) return value;
  return asio::socket_base::max_listen_connections;
}

std::string to_string(const tcp::endpoint& endpoint) {
  const auto address = endpoint.address();
  const std::string host = address.is_v6() ? "[" + address.to_string() + "]" : address.to_string();
  return host + ":" + std::to_string(endpoint.port());
}

// Compares tokens without an early exit, so that timing does not reveal a matching prefix.
bool same_token(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

class RendezvousServer::Impl {
 public:
  class Connection;

  explicit Impl(RendezvousServerOptions options);
  ~Impl();

  void start();
  void stop();
  void accept();
  // The connection closed; job is its job id, or nullptr before a handshake.
  void remove(const Connection* connection, const std::string* job);
  // A connection completed its handshake for job.
  void joined(const std::string& job, const std::string& peer);

  // Constant after construction (port_ after start()).
  const RendezvousServerOptions options_;
  asio::io_context io_;  // declared first among the Asio objects: destroyed last
  RendezvousState state_;
  tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  int port_ = 0;
  bool started_ = false;
  std::atomic<bool> stopped_ = false;

  mutable std::mutex mu_;
  // Guarded by mu_: every open connection, for stop() and num_connections().
  std::unordered_map<const Connection*, std::weak_ptr<Connection>> connections_;
  // Guarded by mu_: connected clients per job, to log when a job comes and goes.
  std::unordered_map<std::string, size_t> job_clients_;
  // Guarded by mu_: jobs without clients whose keys expire (options_.idle_job_ttl > 0).
  std::unordered_map<std::string, std::shared_ptr<asio::steady_timer>> expiries_;
};

// One client connection. All its handlers run on its strand; replies of waiters woken from
// other connections are posted to that strand.
class RendezvousServer::Impl::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Impl& server, tcp::socket socket) : server_(server), socket_(std::move(socket)) {
    error_code ec;
    const auto remote = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("unknown peer") : to_string(remote);
  }

  void start() {
    // Runs on the strand, like every other handler of this connection.
    hello_timer_.expires_after(server_.options_.handshake_timeout);
    hello_timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (ec || self->handshake_done_ || self->closed_) return;
      logger()->warn("rendezvous: {} sent no handshake within {} ms; closing", self->peer_,
                     self->server_.options_.handshake_timeout.count());
      self->close("handshake timeout");
    });
    read_header();
  }

  asio::any_io_executor executor() { return socket_.get_executor(); }

  // Queues a frame; safe from any thread.
  void send(const google::protobuf::MessageLite& message) {
    std::string frame;
    try {
      frame = encode_frame(message, server_.options_.max_frame_bytes, "rendezvous reply");
    } catch (const Error& e) {
      // A reply larger than the frame limit (e.g. a huge multi_get): the client could not read
      // it either, so report it instead.
      proto::Response error;
      error.set_status(proto::STATUS_INVALID_ARGUMENT);
      error.set_error(e.what());
      if (auto* response = dynamic_cast<const proto::Response*>(&message)) {
        error.set_id(response->id());
      }
      frame = encode_frame(error, server_.options_.max_frame_bytes, "rendezvous reply");
    }
    asio::post(socket_.get_executor(),
               [self = shared_from_this(), frame = std::move(frame)]() mutable {
                 self->queue_write(std::move(frame));
               });
  }

  // Closes the socket and drops pending waits; runs on the strand or after the I/O threads
  // stopped.
  void close(const char* why) {
    if (closed_) return;
    closed_ = true;
    logger()->debug("rendezvous: closing connection from {} (job '{}'): {}", peer_, job_, why);
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    hello_timer_.cancel();
    for (auto& weak : waiters_) {
      if (auto waiter = weak.lock()) server_.state_.drop(waiter);
    }
    waiters_.clear();
    server_.remove(this, handshake_done_ ? &job_ : nullptr);
  }

 private:
  void read_header() {
    asio::async_read(
        socket_, asio::buffer(header_), [self = shared_from_this()](error_code ec, size_t) {
          if (ec) return self->close(ec == asio::error::eof ? "peer closed" : ec.message().c_str());
          self->read_body();
        });
  }

  void read_body() {
    const uint32_t length = decode_frame_header(header_.data());
    if (length > server_.options_.max_frame_bytes) {
      logger()->warn("rendezvous: {} sent a frame of {} bytes (limit {}); closing it", peer_,
                     length, server_.options_.max_frame_bytes);
      return close("oversized frame");
    }
    body_.resize(length);
    asio::async_read(socket_, asio::buffer(body_),
                     [self = shared_from_this()](error_code ec, size_t) {
                       if (ec) return self->close(ec.message().c_str());
                       if (self->on_frame()) self->read_header();
                     });
  }

  // Returns false when the connection was closed.
  bool on_frame() {
    if (!handshake_done_) return on_hello();
    proto::Request request;
    if (!request.ParseFromString(body_)) {
      logger()->warn("rendezvous: malformed request frame ({} bytes) from {} (job '{}'); closing",
                     body_.size(), peer_, job_);
      close("malformed frame");
      return false;
    }
    std::weak_ptr<Connection> weak = weak_from_this();
    auto outcome = server_.state_.handle(job_, request, socket_.get_executor(),
                                         [weak](proto::Response response) {
                                           if (auto self = weak.lock()) self->send(response);
                                         });
    if (outcome.response) {
      if (outcome.response->status() == proto::STATUS_INVALID_ARGUMENT) {
        logger()->warn("rendezvous: invalid request from {} (job '{}'): {}", peer_, job_,
                       outcome.response->error());
      }
      send(*outcome.response);
    } else {
      // Forget waiters already answered, so that a long-lived connection does not grow.
      if (waiters_.size() >= 2 * live_waiters_hint_ + 16) {
        std::erase_if(waiters_, [](const auto& w) { return w.expired(); });
        live_waiters_hint_ = waiters_.size();
      }
      waiters_.push_back(outcome.waiter);
    }
    return true;
  }

  bool on_hello() {
    proto::Hello hello;
    proto::HelloReply reply;
    reply.set_version(kProtocolVersion);
    const auto& options = server_.options_;
    std::string refusal;
    if (!hello.ParseFromString(body_) || hello.magic() != kProtocolMagic) {
      refusal = "not an hsgd rendezvous handshake (bad magic)";
    } else if (hello.version() != kProtocolVersion) {
      refusal = "protocol version " + std::to_string(hello.version()) +
                " is not supported; this server speaks version " + std::to_string(kProtocolVersion);
    } else if (!options.token.empty() && !same_token(hello.token(), options.token)) {
      refusal = hello.token().empty() ? "this server requires a token and none was given"
                                      : "invalid token";
    }
    if (!refusal.empty()) {
      logger()->warn("rendezvous: refused {} (job '{}'): {}", peer_, hello.job_id(), refusal);
      reply.set_accepted(false);
      reply.set_error(refusal);
      close_after_write_ = true;
      send(reply);
      return false;  // stop reading; the socket closes once the refusal is written
    }
    handshake_done_ = true;
    hello_timer_.cancel();
    job_ = hello.job_id();
    server_.joined(job_, peer_);
    reply.set_accepted(true);
    reply.set_max_frame_bytes(options.max_frame_bytes);
    reply.set_max_key_bytes(options.max_key_bytes);
    reply.set_max_keys_per_request(options.max_keys_per_request);
    send(reply);
    return true;
  }

  void queue_write(std::string frame) {
    if (closed_) return;
    queued_bytes_ += frame.size();
    // A client that keeps sending without reading its replies would grow this queue without
    // bound; cut it off instead.
    if (queued_bytes_ > 4 * server_.options_.max_frame_bytes + (1 << 20)) {
      logger()->warn("rendezvous: {} does not read its replies ({} bytes queued); closing", peer_,
                     queued_bytes_);
      return close("reply queue overflow");
    }
    writes_.push_back(std::move(frame));
    if (writes_.size() == 1) write_next();
  }

  void write_next() {
    asio::async_write(socket_, asio::buffer(writes_.front()),
                      [self = shared_from_this()](error_code ec, size_t) {
                        if (ec) return self->close(ec.message().c_str());
                        self->queued_bytes_ -= self->writes_.front().size();
                        self->writes_.pop_front();
                        if (!self->writes_.empty()) {
                          self->write_next();
                        } else if (self->close_after_write_) {
                          self->close("handshake refused");
                        }
                      });
  }

  Impl& server_;
  tcp::socket socket_;
  asio::steady_timer hello_timer_{socket_.get_executor()};
  std::string peer_;
  // Touched only on the strand.
  std::array<uint8_t, kFrameHeaderBytes> header_{};
  std::string body_;
  bool handshake_done_ = false;
  bool close_after_write_ = false;
  bool closed_ = false;
  std::string job_;
  std::deque<std::string> writes_;
  size_t queued_bytes_ = 0;
  std::vector<std::weak_ptr<RendezvousState::Waiter>> waiters_;
  size_t live_waiters_hint_ = 0;
};

RendezvousServer::Impl::Impl(RendezvousServerOptions options)
    : options_(std::move(options)),
      state_(RendezvousLimits{.max_key_bytes = options_.max_key_bytes,
                              .max_keys_per_request = options_.max_keys_per_request}),
      acceptor_(io_) {
  HSGD_CHECK(options_.port >= 0 && options_.port <= 65535, "RendezvousServer: port ", options_.port,
             " must be in [0, 65535]");
  HSGD_CHECK(options_.threads >= 1, "RendezvousServer: threads ", options_.threads,
             " must be at least 1");
  HSGD_CHECK(options_.max_frame_bytes >= 1024 && options_.max_frame_bytes <= (1u << 31),
             "RendezvousServer: max_frame_bytes ", options_.max_frame_bytes,
             " must be in [1024, 2^31]");
  HSGD_CHECK(options_.max_key_bytes >= 1, "RendezvousServer: max_key_bytes must be positive");
  HSGD_CHECK(options_.max_keys_per_request >= 1,
             "RendezvousServer: max_keys_per_request must be positive");
  HSGD_CHECK(!options_.host.empty(), "RendezvousServer: host must not be empty");
  HSGD_CHECK(options_.handshake_timeout.count() > 0, "RendezvousServer: handshake_timeout ",
             options_.handshake_timeout.count(), " ms must be positive");
}

RendezvousServer::Impl::~Impl() { stop(); }

void RendezvousServer::Impl::start() {
  HSGD_CHECK(!started_, "RendezvousServer::start: already started on ", options_.host, ":", port_);
  HSGD_CHECK(!stopped_, "RendezvousServer::start: the server was stopped; create a new one");
  const std::string where = options_.host + ":" + std::to_string(options_.port);
  error_code ec;
  tcp::resolver resolver(io_);
  auto endpoints = resolver.resolve(options_.host, std::to_string(options_.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || endpoints.empty()) {
    HSGD_THROW(CommError, "RendezvousServer: cannot resolve ", where, ": ", ec.message());
  }
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(listen_backlog(), ec);
  if (ec) {
    error_code ignored;
    acceptor_.close(ignored);
    HSGD_THROW(CommError, "RendezvousServer: cannot listen on ", where, ": ", ec.message());
  }
  port_ = acceptor_.local_endpoint().port();
  started_ = true;
  accept();
  for (int i = 0; i < options_.threads; ++i) {
    threads_.emplace_back([this] {
      // A handler that throws must not take the whole server down with it.
      for (;;) {
        try {
          io_.run();
          return;
        } catch (const std::exception& e) {
          logger()->error("rendezvous: unexpected error in an I/O handler: {}", e.what());
        }
      }
    });
  }
  logger()->info("rendezvous: listening on {} ({} I/O thread(s), backlog {})",
                 to_string(acceptor_.local_endpoint()), options_.threads, listen_backlog());
}

void RendezvousServer::Impl::accept() {
  acceptor_.async_accept(asio::make_strand(io_), [this](error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      // EMFILE and friends: log, and keep accepting (the client's connect retries).
      logger()->error("rendezvous: accept failed: {}", ec.message());
    } else {
      error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      auto connection = std::make_shared<Connection>(*this, std::move(socket));
      {
        std::lock_guard lock(mu_);
        connections_.emplace(connection.get(), connection);
      }
      asio::dispatch(connection->executor(), [connection] { connection->start(); });
    }
    accept();
  });
}

void RendezvousServer::Impl::joined(const std::string& job, const std::string& peer) {
  std::lock_guard lock(mu_);
  // One line per job at info level (a 1,000-rank job would otherwise log 1,000 lines); every
  // connection at debug level.
  if (job_clients_[job]++ == 0) logger()->info("rendezvous: job '{}': first client {}", job, peer);
  if (auto it = expiries_.find(job); it != expiries_.end()) {
    it->second->cancel();  // the handler sees the job has a client again
    expiries_.erase(it);
  }
  logger()->debug("rendezvous: {} joined job '{}'", peer, job);
}

void RendezvousServer::Impl::remove(const Connection* connection, const std::string* job) {
  std::lock_guard lock(mu_);
  connections_.erase(connection);
  if (job == nullptr) return;
  auto it = job_clients_.find(*job);
  if (it != job_clients_.end() && --it->second == 0) {
    job_clients_.erase(it);
    if (options_.idle_job_ttl.count() <= 0 || stopped_) {
      logger()->info("rendezvous: job '{}': last client disconnected (its keys are kept)", *job);
      return;
    }
    logger()->info(
        "rendezvous: job '{}': last client disconnected (its keys are deleted unless a client "
        "returns within {} ms)",
        *job, options_.idle_job_ttl.count());
    auto timer = std::make_shared<asio::steady_timer>(io_, options_.idle_job_ttl);
    expiries_[*job] = timer;
    timer->async_wait([this, name = *job, timer](error_code ec) {
      if (ec) return;  // cancelled: a client returned, or the server is stopping
      std::lock_guard lock(mu_);
      auto pending = expiries_.find(name);
      if (pending == expiries_.end() || pending->second != timer) return;
      expiries_.erase(pending);
      if (job_clients_.count(name) != 0) return;
      state_.erase_job(name);
      logger()->info("rendezvous: job '{}': keys deleted after {} ms without clients", name,
                     options_.idle_job_ttl.count());
    });
  }
}

void RendezvousServer::Impl::stop() {
  if (stopped_.exchange(true)) return;
  // Stop the I/O threads first, then close everything from this thread: no handler runs
  // concurrently with the teardown. Handlers still queued are destroyed with io_.
  io_.stop();
  for (auto& thread : threads_) thread.join();
  threads_.clear();
  error_code ignored;
  acceptor_.close(ignored);
  std::vector<std::shared_ptr<Connection>> open;
  {
    std::lock_guard lock(mu_);
    for (auto& [ptr, weak] : connections_) {
      if (auto connection = weak.lock()) open.push_back(std::move(connection));
    }
  }
  for (auto& connection : open) connection->close("server stopping");
  {
    std::lock_guard lock(mu_);
    expiries_.clear();  // their handlers were destroyed with the stopped io_context's queue
  }
  state_.clear();
  if (started_) logger()->info("rendezvous: stopped ({}:{})", options_.host, port_);
}

RendezvousServer::RendezvousServer(RendezvousServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

RendezvousServer::~RendezvousServer() = default;

void RendezvousServer::start() { impl_->start(); }

int RendezvousServer::port() const { return impl_->port_; }

std::string RendezvousServer::host() const { return impl_->options_.host; }

void RendezvousServer::stop() { impl_->stop(); }

size_t RendezvousServer::num_connections() const {
  std::lock_guard lock(impl_->mu_);
  return impl_->connections_.size();
}

size_t RendezvousServer::num_pending_waits() const { return impl_->state_.num_waiters(); }

size_t RendezvousServer::num_jobs() const { return impl_->state_.num_jobs(); }

}  // namespace hsgd::comm
