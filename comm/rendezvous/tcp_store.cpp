#include "comm/rendezvous/tcp_store.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <random>
#include <shared_mutex>
#include <thread>

#include "comm/error.h"
#include "comm/log.h"
#include "comm/rendezvous/detail/tcp_store_journal.h"
#include "comm/rendezvous/frame.h"
#include "comm/rendezvous/proto/rendezvous.pb.h"
#include "comm/rendezvous/rendezvous_server_tokens.h"
#include "comm/rendezvous/rendezvous_socket.h"

namespace hsgd::comm {

using Clock = SocketClock;

namespace {

// How long after a server-side deadline the client still waits for the server's TIMEOUT answer
// before it decides the server went silent.
constexpr Duration kReplySlack = std::chrono::seconds(10);
// Backoff of the first connection (the constructor).
constexpr Duration kFirstBackoff = std::chrono::milliseconds(10);
constexpr Duration kMaxBackoff = std::chrono::seconds(1);
// Backoff while reconnecting after the server was lost (a restart takes seconds).
constexpr Duration kFirstOutageBackoff = std::chrono::milliseconds(100);
constexpr Duration kMaxOutageBackoff = std::chrono::seconds(2);
// Deadline of one reconnection attempt: when the caller does not wait (NoServerWait, the
// background thread, ping), and when it does.
constexpr Duration kQuickAttempt = std::chrono::seconds(1);
constexpr Duration kLongAttempt = std::chrono::seconds(5);
// How often the background thread looks at the idle connections of a client that wrote.
constexpr Duration kWatchInterval = std::chrono::milliseconds(250);
// An operation whose connection is lost this often in a row, the server answering each new
// connection, gives up (a server that closes on every request must not loop us forever).
constexpr int kMaxLostConnections = 5;
// Idle connections kept for reuse; more are closed when released.
constexpr size_t kMaxIdleConnections = 4;
// Durations beyond this are treated as "forever" without overflowing time_point arithmetic.
constexpr Duration kMaxDuration = std::chrono::hours(24 * 365);

Clock::time_point deadline_after(Duration d) {
  return Clock::now() + std::clamp(d, Duration(0), kMaxDuration);
}

Duration elapsed_since(Clock::time_point t) {
  return std::chrono::duration_cast<Duration>(Clock::now() - t);
}

std::string seconds_text(Duration d) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", std::chrono::duration<double>(d).count());
  return text;
}

std::string quote_keys(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 8;
  std::string out = "[";
  for (size_t i = 0; i < keys.size() && i < kShown; ++i) {
    if (i > 0) out += ", ";
    out += "'" + keys[i] + "'";
  }
  if (keys.size() > kShown) out += ", ... (" + std::to_string(keys.size()) + " keys)";
  return out + "]";
}

std::string to_std_string(const Bytes& b) { return std::string(b.begin(), b.end()); }
Bytes to_bytes_value(const std::string& s) { return Bytes(s.begin(), s.end()); }

std::string strip_brackets(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

// 128 random bits in hex: the owner this client names in its handshakes.
std::string new_owner() {
  std::random_device device;
  std::string out;
  for (int i = 0; i < 4; ++i) {
    char part[9];
    std::snprintf(part, sizeof(part), "%08x", static_cast<unsigned>(device()));
    out += part;
  }
  return out;
}

bool is_write(proto::Op op) {
  return op == proto::OP_SET || op == proto::OP_SET_OWNED || op == proto::OP_MULTI_SET ||
         op == proto::OP_ADD || op == proto::OP_COMPARE_SET || op == proto::OP_DELETE_KEY;
}

}  // namespace

// Holds a small pool of handshaken connections. An operation takes one for its whole round
// trip, so a get() blocking in one thread never delays a set() from another thread of the same
// store (which would otherwise deadlock "wait in one thread, set in another" until the timeout).
// Keeps what this client wrote, and re-publishes it to a server that is a new instance.
class TcpStore::Client {
 public:
  explicit Client(TcpStoreOptions options)
      : options_(std::move(options)),
        host_(strip_brackets(options_.host)),
        endpoint_(host_.find(':') != std::string::npos
                      ? "[" + host_ + "]:" + std::to_string(options_.port)
                      : host_ + ":" + std::to_string(options_.port)),
        reconnect_timeout_(options_.reconnect_timeout.value_or(options_.connect_timeout)),
        owner_(new_owner()),
        rng_(std::random_device{}()) {
    HSGD_CHECK(options_.port > 0 && options_.port <= 65535, "TcpStore: port ", options_.port,
               " must be in [1, 65535]");
    HSGD_CHECK(!host_.empty(), "TcpStore: host must not be empty");
    HSGD_CHECK(options_.timeout.count() > 0, "TcpStore: timeout ", options_.timeout.count(),
               " ms must be positive");
    HSGD_CHECK(options_.connect_timeout.count() >= 0, "TcpStore: connect_timeout ",
               options_.connect_timeout.count(), " ms must not be negative");
    HSGD_CHECK(reconnect_timeout_.count() >= 0, "TcpStore: reconnect_timeout ",
               reconnect_timeout_.count(), " ms must not be negative");
    if (options_.insecure) {
      HSGD_CHECK(options_.token.empty(),
                 "TcpStore: an insecure connection carries no token; "
                 "leave TcpStoreOptions::token empty, or connect with TLS (insecure = false)");
    } else {
      HSGD_CHECK(!options_.token.empty(), "TcpStore: job '", options_.job_id,
                 "' has no token: TLS to ", endpoint_,
                 " is keyed by the job's token; set "
                 "TcpStoreOptions::token, or insecure = true for a server started insecure");
      // The job id is part of the TLS identity: a server refusing it could not say why.
      if (auto problem = job_id_problem(options_.job_id)) {
        HSGD_THROW(InvalidArgument, "TcpStore: ", *problem);
      }
      tls_ = tls::Context::client();
      // A server that stops closes its sockets without a TLS close_notify: that is the server
      // closing the connection (an outage, retried), not an attack on the stream, whose frames
      // carry their own lengths.
      SSL_CTX_set_options(tls_->native(), SSL_OP_IGNORE_UNEXPECTED_EOF);
      identity_ = tls::psk_identity("store", options_.job_id,
                                    options_.name.empty() ? owner_ : options_.name);
      psk_ = tls::derive_psk(options_.token, identity_);
    }
    Connection first = connect(options_.connect_timeout);
    known_instance_ = first.instance;
    release(std::move(first));
  }

  ~Client() {
    {
      std::lock_guard lock(watch_mu_);
      stopping_ = true;
    }
    watch_cv_.notify_all();
    if (watcher_.joinable()) watcher_.join();
  }

  // Sends request and returns the server's OK answer. blocking_timeout is the server-side
  // deadline of get/wait/multi_get (std::nullopt for the other operations).
  proto::Response call(proto::Request& request, const char* op,
                       const std::vector<std::string>& keys,
                       std::optional<Duration> blocking_timeout) {
    const std::string context = endpoint_ + ": " + op + "(" + quote_keys(keys) + ")";
    check_limits(request, context);
    const Clock::time_point started = Clock::now();
    const bool write = is_write(request.op());
    bool sent_before = false;
    int lost = 0;
    for (;;) {
      // A get/wait/multi_get does not wait for the server longer than its own timeout.
      std::optional<Clock::time_point> give_up;
      if (blocking_timeout)
        give_up = started + std::clamp(*blocking_timeout, Duration(0), kMaxDuration);
      Connection connection = acquire(context, give_up);
      Duration budget = options_.timeout;
      if (blocking_timeout) {
        // Sent again after a lost connection: what is left of the caller's timeout.
        const Duration wait =
            std::clamp(*blocking_timeout - elapsed_since(started), Duration(0), kMaxDuration);
        request.set_timeout_ms(wait.count());
        budget = wait + std::min(options_.timeout, kReplySlack);
      }
      const Clock::time_point deadline = deadline_after(budget);
      request.set_id(next_id_.fetch_add(1) + 1);
      const std::string frame = encode_frame(request, max_frame_bytes_, context.c_str());
      proto::Response response;
      // A write and its record in the journal happen together, never across a re-publication.
      std::shared_lock<std::shared_mutex> write_lock;
      if (write) write_lock = std::shared_lock(republish_mu_);
      try {
        connection.socket->write_all(frame, deadline);
        connection.socket->read_frame(response, max_frame_bytes_ + kFrameHeaderBytes, deadline);
        if (response.id() != request.id()) {
          throw SocketFailure{false, "reply id " + std::to_string(response.id()) +
                                         " does not match request id " +
                                         std::to_string(request.id())};
        }
      } catch (const SocketFailure& failure) {
        // The stream is in an unknown state (a late reply may still arrive): the socket is
        // dropped here.
        if (failure.timed_out) {
          HSGD_THROW(Timeout, "TcpStore ", context, ": no reply from the server within ",
                     budget.count(), " ms");
        }
        if (write) write_lock.unlock();
        lost_server(failure.what);
        if (++lost >= kMaxLostConnections) {
          HSGD_THROW(CommError, "TcpStore ", context, ": the connection was lost ", lost,
                     " times in a row; last: ", failure.what);
        }
        logger()->debug("TcpStore {}: connection lost ({}); sending again once connected", context,
                        failure.what);
        if (request.op() == proto::OP_ADD) resend_add_or_throw(connection, context, failure);
        sent_before = true;
        continue;
      }
      // Sent twice: the first may have swapped already (see tcp_store.h).
      if (sent_before && request.op() == proto::OP_COMPARE_SET &&
          response.status() == proto::STATUS_OK && !response.flag() &&
          response.values_size() == 1 && response.values(0) == request.values(1)) {
        response.set_flag(true);
      }
      if (response.status() == proto::STATUS_OK && write) record(request, response);
      if (write) write_lock.unlock();
      release(std::move(connection));
      switch (response.status()) {
        case proto::STATUS_OK:
          return response;
        case proto::STATUS_TIMEOUT: {
          std::vector<std::string> missing(response.missing_keys().begin(),
                                           response.missing_keys().end());
          HSGD_THROW(Timeout, "TcpStore ", context, ": timed out after ",
                     blocking_timeout.value_or(Duration(0)).count(),
                     " ms; keys still missing: ", quote_keys(missing));
        }
        case proto::STATUS_INVALID_ARGUMENT:
          HSGD_THROW(InvalidArgument, "TcpStore ", context,
                     ": the server rejected the request: ", response.error());
        default:
          HSGD_THROW(CommError, "TcpStore ", context, ": unknown reply status ", response.status());
      }
    }
  }

  // One round trip that never waits for a server that is away.
  bool ping() {
    try {
      const NoServerWait no_wait;
      auto request = proto::Request();
      request.set_op(proto::OP_PING);
      call(request, "ping", {}, std::nullopt);
      return true;
    } catch (const Error& e) {
      logger()->debug("TcpStore {}: ping failed: {}", endpoint_, e.what());
      return false;
    }
  }

  const std::string& endpoint() const { return endpoint_; }
  uint32_t server_version() const { return server_version_; }

 private:
  struct Connection {
    std::unique_ptr<Socket> socket;
    uint64_t instance = 0;  // of the server it reached (0: an older server that does not say)
  };

  // The server was lost while the client reconnects, for messages and the bound.
  struct Outage {
    std::chrono::system_clock::time_point since_wall;
    Clock::time_point since;
    Clock::time_point next_attempt;
    Duration backoff = kFirstOutageBackoff;
    int attempts = 0;
    bool final_attempt = false;  // the one made at the bound
    std::string lost_with;       // what ended the last connection
    std::string last_error;      // of the last attempt
  };

  // An idle connection the server has not closed, or a new one.
  Connection acquire(const std::string& context,
                     std::optional<Clock::time_point> give_up = std::nullopt) {
    {
      std::lock_guard lock(mu_);
      while (!idle_.empty()) {
        Connection connection = std::move(idle_.back());
        idle_.pop_back();
        if (!connection.socket->peer_closed()) return connection;
        start_outage_locked("the server closed the connection");
      }
    }
    logger()->debug("TcpStore {}: opening a connection", context);
    return reconnect(context, /*wait=*/!NoServerWait::active(), give_up);
  }

  // A connection that just completed a round trip: the server is there.
  void release(Connection connection) {
    std::lock_guard lock(mu_);
    end_outage_locked();
    if (idle_.size() < kMaxIdleConnections) idle_.push_back(std::move(connection));
  }

  // Rejects locally what the server would reject, with a clearer message.
  void check_limits(const proto::Request& request, const std::string& context) const {
    const uint64_t max_keys = max_keys_per_request_;
    const uint64_t max_key_bytes = max_key_bytes_;
    HSGD_CHECK(static_cast<uint64_t>(request.keys_size()) <= max_keys, "TcpStore ", context, ": ",
               request.keys_size(), " keys exceed the server limit of ", max_keys, " per request");
    for (const auto& key : request.keys()) {
      HSGD_CHECK(key.size() <= max_key_bytes, "TcpStore ", context, ": key of ", key.size(),
                 " bytes exceeds the server limit of ", max_key_bytes, " bytes");
    }
  }

  // The first connection: retries with exponential backoff and jitter until budget passes. A
  // refused handshake (token, version) is final and throws CommError at once.
  Connection connect(Duration budget) {
    const Clock::time_point deadline = deadline_after(budget);
    Duration backoff = kFirstBackoff;
    int attempts = 0;
    std::string last_error;
    for (;;) {
      ++attempts;
      try {
        auto socket = std::make_unique<Socket>(host_, options_.port, deadline);
        const uint64_t instance = handshake(*socket, deadline);
        return Connection{std::move(socket), instance};
      } catch (const SocketFailure& failure) {
        last_error = failure.what;
      }
      const auto now = Clock::now();
      if (now >= deadline) break;
      std::this_thread::sleep_for(std::min<Clock::duration>(jitter(backoff), deadline - now));
      backoff = std::min(2 * backoff, kMaxBackoff);
    }
    HSGD_THROW(Timeout, "TcpStore: could not connect to the rendezvous server at ", endpoint_,
               " within ", budget.count(), " ms (", attempts, " attempts; last error: ", last_error,
               ")");
  }

  // A random pause in [backoff / 2, backoff]: clients that lost the server together do not
  // retry in lockstep.
  Duration jitter(Duration backoff) {
    std::lock_guard lock(rng_mu_);
    return Duration(
        std::uniform_int_distribution<int64_t>(backoff.count() / 2, backoff.count())(rng_));
  }

  // A connection lost while in use: the server may be gone. Idle connections to it are
  // dropped when next taken (they are closed too, or still good).
  void lost_server(const std::string& why) {
    std::lock_guard lock(mu_);
    start_outage_locked(why);
  }

  void start_outage_locked(const std::string& why) {
    if (outage_) return;
    outage_ = Outage{.since_wall = std::chrono::system_clock::now(),
                     .since = Clock::now(),
                     .next_attempt = Clock::now(),
                     .lost_with = why,
                     .last_error = why};
  }

  ServerOutage describe_locked() const {
    return ServerOutage{.endpoint = endpoint_,
                        .since = outage_->since_wall,
                        .duration = elapsed_since(outage_->since),
                        .bound = reconnect_timeout_,
                        .attempts = outage_->attempts,
                        .last_error = outage_->last_error};
  }

  // The error of an outage longer than reconnect_timeout.
  [[noreturn]] void throw_unreachable_locked(const std::string& context) const {
    const ServerOutage o = describe_locked();
    // What matters first: hsgd-run prints this as its last word.
    HSGD_THROW(CommError, "the rendezvous server at ", endpoint_, " is unreachable since ",
               utc_text(o.since), " (for ", seconds_text(o.duration), ", longer than ",
               options_.reconnect_timeout_name, " ", seconds_text(reconnect_timeout_),
               "); the connection ended with: ", outage_->lost_with, ". Tried: ", o.attempts,
               " connection attempts with backoff (0.1 s doubling to 2 s); the last one failed "
               "with: ",
               o.last_error, ". Start the rendezvous server again at ", endpoint_,
               " (the same port and tokens): its clients re-publish what they wrote to it. Or "
               "raise ",
               options_.reconnect_timeout_name, " to ride out longer outages. [TcpStore ", context,
               "]");
  }

  // A new connection during (or at the start of) an outage: one attempt when one is due,
  // waiting for it with backoff when `wait`; re-publishes when the server is a new instance.
  // Throws ServerUnavailable (not waiting, server away) or CommError (outage past its bound,
  // or the server refused the handshake).
  // A waiting caller gives up at give_up (hsgd::Timeout), if that comes before the bound.
  Connection reconnect(const std::string& context, bool wait,
                       std::optional<Clock::time_point> give_up = std::nullopt) {
    for (;;) {
      Duration attempt_budget = wait ? kLongAttempt : kQuickAttempt;
      {
        std::unique_lock lock(mu_);
        if (outage_ && outage_->attempts > 0 && give_up && Clock::now() >= *give_up) {
          const ServerOutage o = describe_locked();
          HSGD_THROW(Timeout, "TcpStore ", context,
                     ": timed out waiting for the rendezvous server, unreachable since ",
                     utc_text(o.since), " (", o.attempts,
                     " connection attempts; last error: ", o.last_error, ")");
        }
        if (outage_) {
          const Duration away = elapsed_since(outage_->since);
          const bool expired = away >= reconnect_timeout_;
          // At the bound one last attempt is made (the backoff may have skipped past it).
          if (expired && outage_->final_attempt) throw_unreachable_locked(context);
          if (expired) outage_->final_attempt = true;
          const auto now = Clock::now();
          if (!expired && now < outage_->next_attempt) {
            if (!wait) throw_unavailable_locked(context);
            auto until = std::min(outage_->next_attempt, outage_->since + reconnect_timeout_);
            if (give_up) until = std::min(until, *give_up);
            lock.unlock();
            std::this_thread::sleep_until(until);
            continue;
          }
          attempt_budget = std::clamp(reconnect_timeout_ - away, Duration(100), attempt_budget);
        }
      }
      try {
        const Clock::time_point deadline = deadline_after(attempt_budget);
        auto socket = std::make_unique<Socket>(host_, options_.port, deadline);
        const uint64_t instance = handshake(*socket, deadline);
        republish_if_new(instance, *socket, deadline_after(options_.timeout));
        if (had_outage()) reown_if_same(instance, *socket, deadline_after(options_.timeout));
        end_outage();
        return Connection{std::move(socket), instance};
      } catch (const SocketFailure& failure) {
        std::unique_lock lock(mu_);
        start_outage_locked(failure.what);
        Outage& o = *outage_;
        if (o.attempts++ == 0) {
          logger()->warn(
              "TcpStore {}: lost the rendezvous server at {} ({}); reconnecting with backoff for "
              "up to {} ({})",
              context, endpoint_, o.lost_with, seconds_text(reconnect_timeout_),
              options_.reconnect_timeout_name);
        }
        o.last_error = failure.what;
        o.next_attempt = Clock::now() + jitter(o.backoff);
        o.backoff = std::min(2 * o.backoff, kMaxOutageBackoff);
        if (o.final_attempt) throw_unreachable_locked(context);
        if (!wait) throw_unavailable_locked(context);
      }
    }
  }

  [[noreturn]] void throw_unavailable_locked(const std::string& context) const {
    const ServerOutage o = describe_locked();
    throw ServerUnavailable(
        str_cat("TcpStore ", context, ": the rendezvous server at ", endpoint_,
                " is unreachable since ", utc_text(o.since), " (", seconds_text(o.duration), ", ",
                o.attempts, " connection attempts; last error: ", o.last_error,
                "); still trying for up to ", seconds_text(reconnect_timeout_), " (",
                options_.reconnect_timeout_name, ")"),
        o);
  }

  void end_outage() {
    std::lock_guard lock(mu_);
    end_outage_locked();
  }

  void end_outage_locked() {
    if (!outage_) return;
    if (outage_->attempts > 0) {
      logger()->info("TcpStore {}: reached the rendezvous server again after {} ({} attempts)",
                     endpoint_, seconds_text(elapsed_since(outage_->since)), outage_->attempts);
    }
    outage_.reset();
  }

  // The handshake; returns the server's instance (0 from an older server).
  uint64_t handshake(Socket& socket, Clock::time_point deadline) {
    if (tls_) {
      try {
        socket.start_tls(tls_, identity_, psk_, deadline);
      } catch (const SocketFailure& failure) {
        if (!failure.refused) throw;
        if (tls_->uses_certificates()) {
          HSGD_THROW(CommError, "TcpStore: the rendezvous server at ", endpoint_,
                     " refused the TLS connection for job '", options_.job_id, "': ",
                     failure.what);
        }
        HSGD_THROW(CommError, "TcpStore: the rendezvous server at ", endpoint_,
                   " refused the TLS handshake for job '", options_.job_id,
                   "': it holds another token for this job, or none, or it was started "
                   "insecure (",
                   failure.what, ")");
      }
    }
    proto::Hello hello;
    hello.set_magic(kProtocolMagic);
    hello.set_version(kProtocolVersion);
    hello.set_job_id(options_.job_id);
    hello.set_owner(owner_);
    socket.write_all(encode_frame(hello, 1 << 20, "TcpStore handshake"), deadline);
    proto::HelloReply reply;
    socket.read_frame(reply, 1 << 20, deadline);
    if (!reply.accepted()) {
      HSGD_THROW(CommError, "TcpStore: the rendezvous server at ", endpoint_,
                 " refused the connection for job '", options_.job_id, "': ", reply.error());
    }
    server_version_ = reply.version();
    max_frame_bytes_ = reply.max_frame_bytes();
    max_key_bytes_ = reply.max_key_bytes();
    max_keys_per_request_ = reply.max_keys_per_request();
    return reply.instance();
  }

  // Writes the journal to a server that is not the one it was written to, once per instance,
  // before this client's other operations reach it (they wait for republish_mu_).
  void republish_if_new(uint64_t instance, Socket& socket, Clock::time_point deadline) {
    if (instance == 0 || instance == known_instance_.load()) return;
    std::unique_lock lock(republish_mu_);
    if (instance == known_instance_.load()) return;
    auto replay = journal_.replay(max_keys_per_request_, max_frame_bytes_);
    for (auto& request : replay.requests) send_republished(socket, request, deadline);
    known_instance_ = instance;
    if (replay.keys == 0) return;
    logger()->info(
        "TcpStore {}: the rendezvous server is a new instance (restarted): re-published the {} "
        "key(s) this client wrote to job '{}'",
        endpoint_, replay.keys, options_.job_id);
  }

  bool had_outage() {
    std::lock_guard lock(mu_);
    return outage_.has_value();
  }

  // Sets the owned keys again on the same server after this client lost its connections: the
  // server may have expired them meanwhile (their linger passed with no connection open).
  void reown_if_same(uint64_t instance, Socket& socket, Clock::time_point deadline) {
    if (instance != known_instance_.load()) return;  // a new instance got them re-published
    std::unique_lock lock(republish_mu_);
    auto replay = journal_.replay_owned();
    for (auto& request : replay.requests) send_republished(socket, request, deadline);
  }

  void send_republished(Socket& socket, proto::Request& request, Clock::time_point deadline) {
    request.set_id(next_id_.fetch_add(1) + 1);
    socket.write_all(encode_frame(request, max_frame_bytes_, "TcpStore re-publish"), deadline);
    proto::Response response;
    socket.read_frame(response, max_frame_bytes_ + kFrameHeaderBytes, deadline);
    if (response.status() != proto::STATUS_OK) {
      // A new server with smaller quotas: what fits is there; the rest is named.
      logger()->error("TcpStore {}: re-publishing {} key(s) to the restarted server failed: {}",
                      endpoint_, request.keys_size(), response.error());
    }
  }

  // An add() whose connection was lost may have been applied. Sent again only to a server
  // that is a new instance (which never saw it); that connection is left for the next try.
  void resend_add_or_throw(Connection& lost, const std::string& context,
                           const SocketFailure& failure) {
    Connection next;
    try {
      next = reconnect(context, /*wait=*/!NoServerWait::active());
    } catch (const ServerUnavailable& e) {
      HSGD_THROW(CommError, "TcpStore ", context,
                 ": the connection was lost with the add in flight (", failure.what,
                 "), so it may or may not have been applied; ", e.what());
    }
    const bool new_server =
        lost.instance != 0 && next.instance != 0 && next.instance != lost.instance;
    release(std::move(next));
    if (new_server) return;
    HSGD_THROW(CommError, "TcpStore ", context,
               ": the connection was lost with the add in flight (", failure.what,
               ") and the server is still the same, so it may or may not have been "
               "applied");
  }

  // Keeps what a successful write left on the server, for re-publishing.
  void record(const proto::Request& request, const proto::Response& response) {
    if (options_.republish && journal_.record(request, response)) start_watcher();
  }

  // The background thread of a client that wrote: notices a lost server without an operation
  // (a training worker does not use the store) and re-publishes as soon as it is back.
  void start_watcher() {
    std::lock_guard lock(watch_mu_);
    if (watcher_.joinable() || stopping_) return;
    watcher_ = std::thread([this] {
      std::unique_lock lock(watch_mu_);
      while (!watch_cv_.wait_for(lock, kWatchInterval, [this] { return stopping_; })) {
        lock.unlock();
        watch();
        lock.lock();
      }
    });
  }

  void watch() {
    bool lost = false;
    {
      std::lock_guard lock(mu_);
      for (auto it = idle_.begin(); it != idle_.end();) {
        if (it->socket->peer_closed()) {
          start_outage_locked("the server closed the connection");
          it = idle_.erase(it);
        } else {
          ++it;
        }
      }
      lost = outage_.has_value() && idle_.empty() &&
             elapsed_since(outage_->since) < reconnect_timeout_;
    }
    if (!lost) return;
    try {
      release(reconnect(endpoint_ + " (idle)", /*wait=*/false));
    } catch (const Error&) {
      // Still away (or past the bound): the operations report it.
    }
  }

  // Constant after construction.
  const TcpStoreOptions options_;
  const std::string host_;
  const std::string endpoint_;
  const Duration reconnect_timeout_;
  const std::string owner_;  // names this client to the server across its connections
  // TLS (null when insecure): the client context, the identity presented and its key.
  std::shared_ptr<tls::Context> tls_;
  std::string identity_;
  tls::Psk psk_{};

  // Announced by the server in each handshake (the same for every connection to it).
  std::atomic<uint32_t> server_version_ = 0;
  std::atomic<uint64_t> max_frame_bytes_ = 0;
  std::atomic<uint64_t> max_key_bytes_ = 0;
  std::atomic<uint64_t> max_keys_per_request_ = 0;
  std::atomic<uint64_t> next_id_ = 0;

  std::mutex mu_;
  // Guarded by mu_.
  std::vector<Connection> idle_;
  std::optional<Outage> outage_;

  std::mutex rng_mu_;
  std::mt19937_64 rng_;  // guarded by rng_mu_

  // Writes hold it shared from sending to recording; re-publishing holds it exclusively, so
  // that no write is both missing from the snapshot and applied only to the lost server.
  std::shared_mutex republish_mu_;
  std::atomic<uint64_t> known_instance_ = 0;  // written under republish_mu_

  TcpStoreJournal journal_;

  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool stopping_ = false;  // guarded by watch_mu_
  std::thread watcher_;
};

TcpStore::TcpStore(TcpStoreOptions options)
    : client_(std::make_unique<Client>(std::move(options))) {}

TcpStore::~TcpStore() = default;

const std::string& TcpStore::endpoint() const { return client_->endpoint(); }

uint32_t TcpStore::server_version() const { return client_->server_version(); }

namespace {

proto::Request make_request(proto::Op op, const std::vector<std::string>& keys) {
  proto::Request request;
  request.set_op(op);
  for (const auto& key : keys) request.add_keys(key);
  return request;
}

}  // namespace

void TcpStore::set(const std::string& key, const Bytes& value) {
  auto request = make_request(proto::OP_SET, {key});
  request.add_values(to_std_string(value));
  client_->call(request, "set", {key}, std::nullopt);
}

void TcpStore::set_owned(const std::string& key, const Bytes& value, Duration linger) {
  auto request = make_request(proto::OP_SET_OWNED, {key});
  request.add_values(to_std_string(value));
  request.set_linger_ms(std::clamp<int64_t>(linger.count(), 0, kMaxDuration.count()));
  client_->call(request, "set_owned", {key}, std::nullopt);
}

Bytes TcpStore::get(const std::string& key, Duration timeout) {
  auto request = make_request(proto::OP_GET, {key});
  auto response = client_->call(request, "get", {key}, timeout);
  HSGD_CHECK_AS(CommError, response.values_size() == 1, "TcpStore ", endpoint(), ": get('", key,
                "'): expected 1 value in the reply, got ", response.values_size());
  return to_bytes_value(response.values(0));
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  auto request = make_request(proto::OP_ADD, {key});
  request.set_delta(delta);
  return client_->call(request, "add", {key}, std::nullopt).number();
}

CompareSetResult TcpStore::compare_set(const std::string& key, const Bytes& expected,
                                       const Bytes& desired) {
  auto request = make_request(proto::OP_COMPARE_SET, {key});
  request.add_values(to_std_string(expected));
  request.add_values(to_std_string(desired));
  auto response = client_->call(request, "compare_set", {key}, std::nullopt);
  HSGD_CHECK_AS(CommError, response.values_size() == 1, "TcpStore ", endpoint(), ": compare_set('",
                key, "'): expected 1 value in the reply, got ", response.values_size());
  return {.swapped = response.flag(), .current = to_bytes_value(response.values(0))};
}

void TcpStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  auto request = make_request(proto::OP_WAIT, keys);
  client_->call(request, "wait", keys, timeout);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  auto request = make_request(proto::OP_CHECK, keys);
  return client_->call(request, "check", keys, std::nullopt).flag();
}

bool TcpStore::delete_key(const std::string& key) {
  auto request = make_request(proto::OP_DELETE_KEY, {key});
  return client_->call(request, "delete_key", {key}, std::nullopt).flag();
}

int64_t TcpStore::num_keys() {
  auto request = make_request(proto::OP_NUM_KEYS, {});
  return client_->call(request, "num_keys", {}, std::nullopt).number();
}

std::vector<Bytes> TcpStore::multi_get(const std::vector<std::string>& keys, Duration timeout) {
  auto request = make_request(proto::OP_MULTI_GET, keys);
  auto response = client_->call(request, "multi_get", keys, timeout);
  HSGD_CHECK_AS(CommError, static_cast<size_t>(response.values_size()) == keys.size(), "TcpStore ",
                endpoint(), ": multi_get: expected ", keys.size(), " values in the reply, got ",
                response.values_size());
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& value : response.values()) values.push_back(to_bytes_value(value));
  return values;
}

void TcpStore::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  HSGD_CHECK_EQ(keys.size(), values.size(), "TcpStore ", endpoint(),
                ": multi_set: number of keys and values differ");
  auto request = make_request(proto::OP_MULTI_SET, keys);
  for (const auto& value : values) request.add_values(to_std_string(value));
  client_->call(request, "multi_set", keys, std::nullopt);
}

bool TcpStore::ping() { return client_->ping(); }

}  // namespace hsgd::comm
