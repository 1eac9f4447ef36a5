#include "comm/rendezvous/tcp_store.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "comm/error.h"
#include "comm/log.h"
#include "comm/rendezvous/frame.h"
#include "comm/rendezvous/proto/rendezvous.pb.h"
#include "comm/rendezvous/rendezvous_socket.h"

namespace hsgd::comm {

using Clock = SocketClock;

namespace {

// How long after a server-side deadline the client still waits for the server's TIMEOUT answer
// before it decides the server went silent.
constexpr Duration kReplySlack = std::chrono::seconds(10);
constexpr Duration kFirstBackoff = std::chrono::milliseconds(10);
constexpr Duration kMaxBackoff = std::chrono::seconds(1);
// Idle connections kept for reuse; more are closed when released.
constexpr size_t kMaxIdleConnections = 4;
// Durations beyond this are treated as "forever" without overflowing time_point arithmetic.
constexpr Duration kMaxDuration = std::chrono::hours(24 * 365);

Clock::time_point deadline_after(Duration d) {
  return Clock::now() + std::clamp(d, Duration(0), kMaxDuration);
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

}  // namespace

// Holds a small pool of handshaken connections. An operation takes one for its whole round
// trip, so a get() blocking in one thread never delays a set() from another thread of the same
// store (which would otherwise deadlock "wait in one thread, set in another" until the timeout).
class TcpStore::Client {
 public:
  explicit Client(TcpStoreOptions options)
      : options_(std::move(options)),
        host_(strip_brackets(options_.host)),
        endpoint_(host_.find(':') != std::string::npos
                      ? "[" + host_ + "]:" + std::to_string(options_.port)
                      : host_ + ":" + std::to_string(options_.port)),
        rng_(std::random_device{}()) {
    HSGD_CHECK(options_.port > 0 && options_.port <= 65535, "TcpStore: port ", options_.port,
               " must be in [1, 65535]");
    HSGD_CHECK(!host_.empty(), "TcpStore: host must not be empty");
    HSGD_CHECK(options_.timeout.count() > 0, "TcpStore: timeout ", options_.timeout.count(),
               " ms must be positive");
    HSGD_CHECK(options_.connect_timeout.count() >= 0, "TcpStore: connect_timeout ",
               options_.connect_timeout.count(), " ms must not be negative");
    release(connect(options_.connect_timeout));
  }

  // Sends request and returns the server's OK answer. blocking_timeout is the server-side
  // deadline of get/wait/multi_get (std::nullopt for the other operations); a new connection,
  // if one is needed, may take up to reconnect_budget.
  proto::Response call(proto::Request& request, const char* op,
                       const std::vector<std::string>& keys,
                       std::optional<Duration> blocking_timeout, Duration reconnect_budget) {
    const std::string context = endpoint_ + ": " + op + "(" + quote_keys(keys) + ")";
    std::unique_ptr<Socket> socket = acquire(reconnect_budget, op);
    check_limits(request, context);
    Duration budget = options_.timeout;
    if (blocking_timeout) {
      const Duration wait = std::clamp(*blocking_timeout, Duration(0), kMaxDuration);
      request.set_timeout_ms(wait.count());
      budget = wait + std::min(options_.timeout, kReplySlack);
    }
    const Clock::time_point deadline = deadline_after(budget);
    request.set_id(next_id_.fetch_add(1) + 1);
    const std::string frame = encode_frame(request, max_frame_bytes_, context.c_str());
    proto::Response response;
    try {
      socket->write_all(frame, deadline);
      socket->read_frame(response, max_frame_bytes_ + kFrameHeaderBytes, deadline);
      if (response.id() != request.id()) {
        throw SocketFailure{false, "reply id " + std::to_string(response.id()) +
                                       " does not match request id " +
                                       std::to_string(request.id())};
      }
    } catch (const SocketFailure& failure) {
      // The stream is in an unknown state (a late reply may still arrive): the socket is
      // dropped here and the next operation connects afresh.
      if (failure.timed_out) {
        HSGD_THROW(Timeout, "TcpStore ", context, ": no reply from the server within ",
                   budget.count(), " ms");
      }
      HSGD_THROW(CommError, "TcpStore ", context, ": ", failure.what);
    }
    release(std::move(socket));
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

  proto::Response call(proto::Request& request, const char* op,
                       const std::vector<std::string>& keys,
                       std::optional<Duration> blocking_timeout) {
    return call(request, op, keys, blocking_timeout, options_.connect_timeout);
  }

  const std::string& endpoint() const { return endpoint_; }
  uint32_t server_version() const { return server_version_; }
  const TcpStoreOptions& options() const { return options_; }

 private:
  // An idle connection, or a new one.
  std::unique_ptr<Socket> acquire(Duration reconnect_budget, const char* op) {
    {
      std::lock_guard lock(mu_);
      if (!idle_.empty()) {
        auto socket = std::move(idle_.back());
        idle_.pop_back();
        return socket;
      }
    }
    logger()->debug("TcpStore {}: opening a connection for {}", endpoint_, op);
    return connect(reconnect_budget);
  }

  void release(std::unique_ptr<Socket> socket) {
    std::lock_guard lock(mu_);
    if (idle_.size() < kMaxIdleConnections) idle_.push_back(std::move(socket));
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

  // Connects and handshakes, retrying with exponential backoff and jitter until budget passes.
  // A refused handshake (token, version) is final and throws CommError at once.
  std::unique_ptr<Socket> connect(Duration budget) {
    const Clock::time_point deadline = deadline_after(budget);
    Duration backoff = kFirstBackoff;
    int attempts = 0;
    std::string last_error;
    for (;;) {
      ++attempts;
      try {
        auto socket = std::make_unique<Socket>(host_, options_.port, deadline);
        handshake(*socket, deadline);
        return socket;
      } catch (const SocketFailure& failure) {
        last_error = failure.what;
      }
      const auto now = Clock::now();
      if (now >= deadline) break;
      // Jitter: ranks that start together do not retry in lockstep.
      Duration pause;
      {
        std::lock_guard lock(mu_);
        pause = Duration(
            std::uniform_int_distribution<int64_t>(backoff.count() / 2, backoff.count())(rng_));
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
      backoff = std::min(2 * backoff, kMaxBackoff);
    }
    HSGD_THROW(Timeout, "TcpStore: could not connect to the rendezvous server at ", endpoint_,
               " within ", budget.count(), " ms (", attempts, " attempts; last error: ", last_error,
               ")");
  }

  void handshake(Socket& socket, Clock::time_point deadline) {
    proto::Hello hello;
    hello.set_magic(kProtocolMagic);
    hello.set_version(kProtocolVersion);
    hello.set_job_id(options_.job_id);
    hello.set_token(options_.token);
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
  }

  // Constant after construction.
  const TcpStoreOptions options_;
  const std::string host_;
  const std::string endpoint_;

  // Announced by the server in each handshake (the same for every connection to it).
  std::atomic<uint32_t> server_version_ = 0;
  std::atomic<uint64_t> max_frame_bytes_ = 0;
  std::atomic<uint64_t> max_key_bytes_ = 0;
  std::atomic<uint64_t> max_keys_per_request_ = 0;
  std::atomic<uint64_t> next_id_ = 0;

  std::mutex mu_;
  // Guarded by mu_.
  std::vector<std::unique_ptr<Socket>> idle_;
  std::mt19937_64 rng_;
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

bool TcpStore::ping() {
  try {
    auto request = make_request(proto::OP_PING, {});
    // A dead server must not hold ping() for the whole connect_timeout.
    const auto& options = client_->options();
    client_->call(request, "ping", {}, std::nullopt,
                  std::min(options.connect_timeout, options.timeout));
    return true;
  } catch (const Error& e) {
    logger()->debug("TcpStore {}: ping failed: {}", endpoint(), e.what());
    return false;
  }
}

}  // namespace hsgd::comm
