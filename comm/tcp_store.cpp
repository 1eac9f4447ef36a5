#include "comm/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "comm/error.h"
#include "comm/frame.h"
#include "comm/log.h"
#include "proto/rendezvous.pb.h"

namespace hsgd::comm {

using Clock = std::chrono::steady_clock;

namespace {

// How long after a server-side deadline the client still waits for the server's TIMEOUT answer
// before it decides the server went silent.
constexpr Duration kReplySlack = std::chrono::seconds(10);
constexpr Duration kFirstBackoff = std::chrono::milliseconds(10);
constexpr Duration kMaxBackoff = std::chrono::seconds(1);

// An I/O failure below the operation level; call() turns it into Timeout or CommError with the
// endpoint, the operation and the keys.
struct IoFailure {
  bool timed_out;
  std::string what;
};

std::string errno_text(int error) { return std::strerror(error); }

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

// Waits until fd is ready for events or the deadline passes (IoFailure{timed_out = true}).
void wait_ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return;  // readable/writable or an error the next call reports
    if (n == 0) throw IoFailure{true, "no progress before the deadline"};
    if (errno != EINTR) throw IoFailure{false, "poll: " + errno_text(errno)};
  }
}

void write_all(int fd, const std::string& data, Clock::time_point deadline) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_ready(fd, POLLOUT, deadline);
    } else if (errno != EINTR) {
      throw IoFailure{false, "send: " + errno_text(errno)};
    }
  }
}

void read_exact(int fd, uint8_t* out, size_t size, Clock::time_point deadline) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::recv(fd, out + done, size - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n == 0) {
      throw IoFailure{false, "the server closed the connection"};
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_ready(fd, POLLIN, deadline);
    } else if (errno != EINTR) {
      throw IoFailure{false, "recv: " + errno_text(errno)};
    }
  }
}

// Reads one frame into message; a frame above max_bytes is a protocol error.
void read_frame(int fd, google::protobuf::MessageLite& message, size_t max_bytes,
                Clock::time_point deadline) {
  uint8_t header[kFrameHeaderBytes];
  read_exact(fd, header, kFrameHeaderBytes, deadline);
  const uint32_t length = decode_frame_header(header);
  if (length > max_bytes) {
    throw IoFailure{false, "reply frame of " + std::to_string(length) + " bytes exceeds " +
                               std::to_string(max_bytes)};
  }
  std::string body(length, '\0');
  read_exact(fd, reinterpret_cast<uint8_t*>(body.data()), length, deadline);
  if (!message.ParseFromString(body)) throw IoFailure{false, "malformed reply frame"};
}

// Opens a non-blocking TCP connection to host:port, or throws IoFailure.
int connect_socket(const std::string& host, int port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
  if (rc != 0) throw IoFailure{false, std::string("cannot resolve host: ") + gai_strerror(rc)};
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(list, freeaddrinfo);
  std::string last_error = "no address";
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    const int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = "socket: " + errno_text(errno);
      continue;
    }
    try {
      if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) throw IoFailure{false, "connect: " + errno_text(errno)};
        wait_ready(fd, POLLOUT, deadline);
        int error = 0;
        socklen_t len = sizeof(error);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
        if (error != 0) throw IoFailure{false, "connect: " + errno_text(error)};
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return fd;
    } catch (const IoFailure& failure) {
      ::close(fd);
      if (failure.timed_out) throw;
      last_error = failure.what;
    }
  }
  throw IoFailure{false, last_error};
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

}  // namespace

// The socket and everything that touches it; mu_ serializes operations from several threads.
class TcpStore::Connection {
 public:
  explicit Connection(TcpStoreOptions options)
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
    std::lock_guard lock(mu_);
    connect(Clock::now() + options_.connect_timeout);
  }

  ~Connection() { disconnect(); }

  // Sends request and returns the server's OK answer. blocking_timeout is the server-side
  // deadline of get/wait/multi_get (std::nullopt for the other operations).
  proto::Response call(proto::Request& request, const char* op,
                       const std::vector<std::string>& keys,
                       std::optional<Duration> blocking_timeout) {
    std::lock_guard lock(mu_);
    const std::string context = endpoint_ + ": " + op + "(" + quote_keys(keys) + ")";
    if (fd_ < 0) {
      logger()->info("TcpStore {}: reconnecting for {}", endpoint_, op);
      connect(Clock::now() + options_.connect_timeout);
    }
    check_limits(request, context);
    Clock::time_point deadline = Clock::now() + options_.timeout;
    if (blocking_timeout) {
      request.set_timeout_ms(blocking_timeout->count());
      deadline = Clock::now() + *blocking_timeout + std::min(options_.timeout, kReplySlack);
    }
    request.set_id(++last_id_);
    const std::string frame = encode_frame(request, max_frame_bytes_, context.c_str());
    proto::Response response;
    try {
      write_all(fd_, frame, deadline);
      read_frame(fd_, response, max_frame_bytes_ + kFrameHeaderBytes, deadline);
      if (response.id() != request.id()) {
        throw IoFailure{false, "reply id " + std::to_string(response.id()) +
                                   " does not match "
                                   "request id " +
                                   std::to_string(request.id())};
      }
    } catch (const IoFailure& failure) {
      // The stream is in an unknown state (a late reply may still arrive): start afresh on the
      // next operation.
      disconnect();
      if (failure.timed_out) {
        HSGD_THROW(Timeout, "TcpStore ", context, ": no reply from the server within ",
                   remaining_budget(blocking_timeout), " ms");
      }
      HSGD_THROW(CommError, "TcpStore ", context, ": ", failure.what);
    }
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

  const std::string& endpoint() const { return endpoint_; }
  uint32_t server_version() const { return server_version_; }

 private:
  static std::string strip_brackets(const std::string& host) {
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      return host.substr(1, host.size() - 2);
    }
    return host;
  }

  int64_t remaining_budget(std::optional<Duration> blocking_timeout) const {
    return (blocking_timeout ? *blocking_timeout + std::min(options_.timeout, kReplySlack)
                             : options_.timeout)
        .count();
  }

  // Rejects locally what the server would reject, with a clearer message.
  void check_limits(const proto::Request& request, const std::string& context) const {
    HSGD_CHECK(static_cast<uint64_t>(request.keys_size()) <= max_keys_per_request_, "TcpStore ",
               context, ": ", request.keys_size(), " keys exceed the server limit of ",
               max_keys_per_request_, " per request");
    for (const auto& key : request.keys()) {
      HSGD_CHECK(key.size() <= max_key_bytes_, "TcpStore ", context, ": key of ", key.size(),
                 " bytes exceeds the server limit of ", max_key_bytes_, " bytes");
    }
  }

  // Connects and handshakes, retrying with exponential backoff and jitter until deadline.
  // Requires mu_.
  void connect(Clock::time_point deadline) {
    Duration backoff = kFirstBackoff;
    int attempts = 0;
    std::string last_error;
    for (;;) {
      ++attempts;
      try {
        fd_ = connect_socket(host_, options_.port, deadline);
        handshake(deadline);
        return;
      } catch (const IoFailure& failure) {
        disconnect();
        last_error = failure.what;
      }
      const auto now = Clock::now();
      if (now >= deadline) break;
      // Full jitter: ranks that start together do not retry in lockstep.
      std::uniform_int_distribution<int64_t> jitter(backoff.count() / 2, backoff.count());
      const auto pause = std::min<Clock::duration>(Duration(jitter(rng_)), deadline - now);
      std::this_thread::sleep_for(pause);
      backoff = std::min(2 * backoff, kMaxBackoff);
    }
    HSGD_THROW(Timeout, "TcpStore: could not connect to the rendezvous server at ", endpoint_,
               " within ", options_.connect_timeout.count(), " ms (", attempts,
               " attempts; last error: ", last_error, ")");
  }

  void handshake(Clock::time_point deadline) {
    proto::Hello hello;
    hello.set_magic(kProtocolMagic);
    hello.set_version(kProtocolVersion);
    hello.set_job_id(options_.job_id);
    hello.set_token(options_.token);
    write_all(fd_, encode_frame(hello, 1 << 20, "TcpStore handshake"), deadline);
    proto::HelloReply reply;
    read_frame(fd_, reply, 1 << 20, deadline);
    if (!reply.accepted()) {
      disconnect();
      HSGD_THROW(CommError, "TcpStore: the rendezvous server at ", endpoint_,
                 " refused the connection for job '", options_.job_id, "': ", reply.error());
    }
    server_version_ = reply.version();
    max_frame_bytes_ = reply.max_frame_bytes();
    max_key_bytes_ = reply.max_key_bytes();
    max_keys_per_request_ = reply.max_keys_per_request();
  }

  void disconnect() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Constant after construction.
  const TcpStoreOptions options_;
  const std::string host_;
  const std::string endpoint_;

  std::mutex mu_;
  // Guarded by mu_.
  int fd_ = -1;
  uint64_t last_id_ = 0;
  std::mt19937_64 rng_;
  std::atomic<uint32_t> server_version_ = 0;
  uint64_t max_frame_bytes_ = 0;
  uint64_t max_key_bytes_ = 0;
  uint64_t max_keys_per_request_ = 0;
};

TcpStore::TcpStore(TcpStoreOptions options)
    : connection_(std::make_unique<Connection>(std::move(options))) {}

TcpStore::~TcpStore() = default;

const std::string& TcpStore::endpoint() const { return connection_->endpoint(); }

uint32_t TcpStore::server_version() const { return connection_->server_version(); }

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
  connection_->call(request, "set", {key}, std::nullopt);
}

Bytes TcpStore::get(const std::string& key, Duration timeout) {
  auto request = make_request(proto::OP_GET, {key});
  auto response = connection_->call(request, "get", {key}, timeout);
  HSGD_CHECK_AS(CommError, response.values_size() == 1, "TcpStore ", endpoint(), ": get('", key,
                "'): expected 1 value in the reply, got ", response.values_size());
  return to_bytes_value(response.values(0));
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  auto request = make_request(proto::OP_ADD, {key});
  request.set_delta(delta);
  return connection_->call(request, "add", {key}, std::nullopt).number();
}

CompareSetResult TcpStore::compare_set(const std::string& key, const Bytes& expected,
                                       const Bytes& desired) {
  auto request = make_request(proto::OP_COMPARE_SET, {key});
  request.add_values(to_std_string(expected));
  request.add_values(to_std_string(desired));
  auto response = connection_->call(request, "compare_set", {key}, std::nullopt);
  HSGD_CHECK_AS(CommError, response.values_size() == 1, "TcpStore ", endpoint(), ": compare_set('",
                key, "'): expected 1 value in the reply, got ", response.values_size());
  return {.swapped = response.flag(), .current = to_bytes_value(response.values(0))};
}

void TcpStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  auto request = make_request(proto::OP_WAIT, keys);
  connection_->call(request, "wait", keys, timeout);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  auto request = make_request(proto::OP_CHECK, keys);
  return connection_->call(request, "check", keys, std::nullopt).flag();
}

bool TcpStore::delete_key(const std::string& key) {
  auto request = make_request(proto::OP_DELETE_KEY, {key});
  return connection_->call(request, "delete_key", {key}, std::nullopt).flag();
}

int64_t TcpStore::num_keys() {
  auto request = make_request(proto::OP_NUM_KEYS, {});
  return connection_->call(request, "num_keys", {}, std::nullopt).number();
}

std::vector<Bytes> TcpStore::multi_get(const std::vector<std::string>& keys, Duration timeout) {
  auto request = make_request(proto::OP_MULTI_GET, keys);
  auto response = connection_->call(request, "multi_get", keys, timeout);
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
  connection_->call(request, "multi_set", keys, std::nullopt);
}

bool TcpStore::ping() {
  try {
    auto request = make_request(proto::OP_PING, {});
    connection_->call(request, "ping", {}, std::nullopt);
    return true;
  } catch (const Error& e) {
    logger()->debug("TcpStore {}: ping failed: {}", endpoint(), e.what());
    return false;
  }
}

}  // namespace hsgd::comm
