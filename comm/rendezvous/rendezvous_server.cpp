#include "comm/rendezvous/rendezvous_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <fstream>

#include "comm/error.h"
#include "comm/log.h"
#include "comm/rendezvous/detail/rendezvous_server_impl.h"

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

// The default connection limit: the soft RLIMIT_NOFILE minus a reserve for the process's other
// descriptors (listener, epoll, timers, log, and hsgd-run's worker pipes when embedded).
size_t default_max_connections() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 1 << 20;
  const size_t soft = static_cast<size_t>(limit.rlim_cur);
  const size_t reserve = std::clamp<size_t>(soft / 8, 16, 256);
  return soft > reserve + 1 ? soft - reserve : 1;
}

// Out of descriptors or memory: retrying accept at once fails again (and spins).
bool is_resource_error(const error_code& ec) {
  return ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space ||
         ec == asio::error::no_memory || ec.value() == ENFILE;
}

TokenTable token_table(const RendezvousServerOptions& options) {
  return TokenTable{.server_token = options.token, .job_tokens = options.job_tokens};
}

// The key of a client identity: derived from its job's token, or nothing (the handshake fails)
// when the identity names no job with a token. Runs inside OpenSSL's callback: never throws.
std::optional<tls::Psk> psk_of(const TokenTable& tokens, std::string_view identity) {
  const std::optional<std::string> job = tls::identity_job(identity);
  if (!job || job_id_problem(*job)) return std::nullopt;
  const auto own = tokens.job_tokens.find(*job);
  const std::string& token = own != tokens.job_tokens.end() ? own->second : tokens.server_token;
  if (token.empty()) return std::nullopt;
  try {
    return tls::derive_psk(token, identity);
  } catch (const tls::Failure&) {
    return std::nullopt;
  }
}

}  // namespace

std::optional<uint64_t> LogThrottle::allow() {
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (now < next_) {
    ++held_back_;
    return std::nullopt;
  }
  next_ = now + interval_;
  return std::exchange(held_back_, 0);
}

std::string held_back_note(uint64_t held_back) {
  if (held_back == 0) return "";
  return " (" + std::to_string(held_back) + " more like it in the last 10 s)";
}

RendezvousServer::Impl::Impl(RendezvousServerOptions options)
    : options_(std::move(options)),
      tokens_(token_table(options_)),
      state_(RendezvousLimits{.max_key_bytes = options_.max_key_bytes,
                              .max_keys_per_request = options_.max_keys_per_request,
                              .max_keys_per_job = options_.max_keys_per_job,
                              .max_job_bytes = options_.max_job_bytes,
                              .max_waits_per_job = options_.max_waits_per_job,
                              .max_jobs = options_.max_jobs,
                              .names = options_.limit_names}),
      acceptor_(io_),
      accept_strand_(asio::make_strand(io_)),
      accept_backoff_(accept_strand_) {
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
  HSGD_CHECK(options_.max_keys_per_job >= 1 && options_.max_job_bytes >= 1 &&
                 options_.max_waits_per_job >= 1 && options_.max_jobs >= 1,
             "RendezvousServer: max_keys_per_job ", options_.max_keys_per_job, ", max_job_bytes ",
             options_.max_job_bytes, ", max_waits_per_job ", options_.max_waits_per_job,
             " and max_jobs ", options_.max_jobs, " must all be positive");
  HSGD_CHECK(options_.max_handshake_bytes >= 256 &&
                 options_.max_handshake_bytes <= options_.max_frame_bytes,
             "RendezvousServer: max_handshake_bytes ", options_.max_handshake_bytes,
             " must be in [256, max_frame_bytes ", options_.max_frame_bytes, "]");
  HSGD_CHECK(options_.max_unauthenticated_bytes >= options_.max_handshake_bytes,
             "RendezvousServer: max_unauthenticated_bytes ", options_.max_unauthenticated_bytes,
             " must be at least max_handshake_bytes ", options_.max_handshake_bytes);
  HSGD_CHECK(options_.token.size() <= kMaxTokenBytes, "RendezvousServer: the token has ",
             options_.token.size(), " bytes; at most ", kMaxTokenBytes);
  for (const auto& [job, token] : options_.job_tokens) {
    if (auto problem = job_id_problem(job)) {
      HSGD_THROW(InvalidArgument, "RendezvousServer: job_tokens: ", *problem);
    }
    HSGD_CHECK(!token.empty() && token.size() <= kMaxTokenBytes,
               "RendezvousServer: the token of job '", job, "' has ", token.size(),
               " bytes; expected 1 to ", kMaxTokenBytes);
  }
  if (options_.insecure) {
    HSGD_CHECK(tokens_.empty(),
               "RendezvousServer: an insecure server authenticates nobody; it "
               "takes no token (got a server-wide token or ",
               options_.job_tokens.size(), " job tokens)");
  } else {
    HSGD_CHECK(!tokens_.empty(),
               "RendezvousServer: TLS keys its connections from a token, and "
               "neither token nor job_tokens holds one; give one (hsgd-rendezvous --token-file), "
               "or choose insecure (plain TCP, no authentication)");
    tls_ = tls::Context::server(
        [tokens = &tokens_](std::string_view identity) { return psk_of(*tokens, identity); });
    // Asio's context takes ownership of a reference: tls_ keeps its own.
    SSL_CTX_up_ref(tls_->native());
    ssl_context_ = std::make_unique<asio::ssl::context>(tls_->native());
  }
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
  if (!ec) acceptor_.non_blocking(true, ec);  // accept() in a batch must not block (see accept)
  if (ec) {
    error_code ignored;
    acceptor_.close(ignored);
    HSGD_THROW(CommError, "RendezvousServer: cannot listen on ", where, ": ", ec.message());
  }
  port_ = acceptor_.local_endpoint().port();
  max_connections_ =
      options_.max_connections > 0 ? options_.max_connections : default_max_connections();
  started_ = true;
  asio::post(accept_strand_, [this] { accept(); });
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
  logger()->info(
      "rendezvous: listening on {} ({}; {} I/O thread(s), backlog {}, at most {} connections)",
      to_string(acceptor_.local_endpoint()),
      options_.insecure             ? "INSECURE: plain TCP, unencrypted and unauthenticated"
      : tls_->uses_certificates() ? "TLS 1.3 with certificates of the site's CA, identities "
                                    "bound to the job tokens"
                                  : "TLS 1.3 keyed by the job tokens",
      options_.threads, listen_backlog(), max_connections_);
}

void RendezvousServer::Impl::accept() {
  if (stopped_ || !acceptor_.is_open() || !room_to_accept()) return;
  acceptor_.async_accept(
      asio::make_strand(io_),
      asio::bind_executor(accept_strand_, [this](error_code ec, tcp::socket socket) {
        if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
        if (ec) return on_accept_error(ec);
        backoff_ = std::chrono::milliseconds(0);
        adopt(std::move(socket));
        // Take what else waits in the backlog now: one connection per turn of a busy event loop
        // would have thousands of clients connecting at once wait for each other's requests.
        // The listener is non-blocking: accept fails with would_block once the backlog is empty
        // (and any other error is met again by the async_accept below).
        for (int i = 1; i < kAcceptBatch && room_to_accept(); ++i) {
          tcp::socket more = acceptor_.accept(asio::make_strand(io_), ec);
          if (ec) break;
          adopt(std::move(more));
        }
        accept();
      }));
}

bool RendezvousServer::Impl::room_to_accept() {
  std::lock_guard lock(mu_);
  if (connections_.size() < max_connections_) return true;
  // New clients wait in the listen backlog (their connect succeeds, their handshake waits) until
  // remove() resumes accepting.
  accept_paused_ = true;
  if (auto held_back = accept_log_.allow()) {
    logger()->warn(
        "rendezvous: {} connections open, the limit ({}): not accepting until one closes{}",
        connections_.size(), options_.limit_names.max_connections, held_back_note(*held_back));
  }
  return false;
}

void RendezvousServer::Impl::adopt(tcp::socket socket) {
  error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  auto connection = std::make_shared<Connection>(*this, std::move(socket));
  {
    std::lock_guard lock(mu_);
    connections_.emplace(connection.get(), connection);
  }
  asio::dispatch(connection->executor(), [connection] { connection->start(); });
}

void RendezvousServer::Impl::on_accept_error(const error_code& ec) {
  if (!is_resource_error(ec)) {
    // A client that gave up between SYN and accept (ECONNABORTED) and the like: accepting again
    // at once is right.
    if (auto held_back = accept_log_.allow()) {
      logger()->warn("rendezvous: accept failed: {}{}", ec.message(), held_back_note(*held_back));
    }
    return accept();
  }
  // EMFILE/ENFILE/ENOBUFS: the pending connection stays in the backlog and accept would fail at
  // once again. Wait for descriptors to come back (50 ms, doubling up to 1 s), logging once per
  // interval.
  backoff_ =
      std::clamp(backoff_ * 2, std::chrono::milliseconds(50), std::chrono::milliseconds(1000));
  if (auto held_back = accept_log_.allow()) {
    logger()->error("rendezvous: accept failed: {}; retrying every {} ms at most{}", ec.message(),
                    backoff_.count(), held_back_note(*held_back));
  }
  accept_backoff_.expires_after(backoff_);
  accept_backoff_.async_wait([this](error_code wait_ec) {
    if (!wait_ec) accept();
  });
}

bool RendezvousServer::Impl::reserve_unauthenticated(size_t n) {
  const size_t before = unauthenticated_bytes_.fetch_add(n);
  if (before + n <= options_.max_unauthenticated_bytes) return true;
  unauthenticated_bytes_.fetch_sub(n);
  return false;
}

void RendezvousServer::Impl::joined(const std::string& job, const std::string& peer) {
  std::lock_guard lock(mu_);
  // One line per job at info level (a 1,000-rank job would otherwise log 1,000 lines); every
  // connection at debug level.
  if (job_clients_[job]++ == 0) {
    logger()->info("rendezvous: job '{}': first client {}", job, peer);
  }
  if (auto it = expiries_.find(job); it != expiries_.end()) {
    it->second->cancel();  // the handler sees the job has a client again
    expiries_.erase(it);
  }
  logger()->debug("rendezvous: {} joined job '{}'", peer, job);
}

void RendezvousServer::Impl::remove(const Connection* connection, const std::string* job) {
  std::lock_guard lock(mu_);
  connections_.erase(connection);
  if (accept_paused_ && connections_.size() < max_connections_ && !stopped_) {
    accept_paused_ = false;
    asio::post(accept_strand_, [this] { accept(); });
  }
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

bool RendezvousServer::insecure() const { return impl_->options_.insecure; }

std::string RendezvousServer::host() const { return impl_->options_.host; }

void RendezvousServer::stop() { impl_->stop(); }

size_t RendezvousServer::num_connections() const {
  std::lock_guard lock(impl_->mu_);
  return impl_->connections_.size();
}

size_t RendezvousServer::num_pending_waits() const { return impl_->state_.num_waiters(); }

size_t RendezvousServer::num_jobs() const { return impl_->state_.num_jobs(); }

size_t RendezvousServer::unauthenticated_bytes() const {
  return impl_->unauthenticated_bytes_.load();
}

size_t RendezvousServer::max_connections() const { return impl_->max_connections_; }

}  // namespace hsgd::comm
