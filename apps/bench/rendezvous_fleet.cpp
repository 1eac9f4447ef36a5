#include "apps/bench/rendezvous_fleet.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "comm/error.h"
#include "comm/rendezvous/frame.h"
#include "comm/rendezvous/proto/rendezvous.pb.h"

namespace hsgd::bench {

namespace {

using Clock = std::chrono::steady_clock;
namespace proto = hsgd::comm::proto;
using hsgd::comm::kFrameHeaderBytes;

// Larger replies are refused by the default server anyway (max_frame_bytes).
constexpr uint32_t kMaxReplyBytes = 64u << 20;
constexpr size_t kScratchBytes = 256 << 10;

enum class Step { kIdle, kConnecting, kHello, kSet, kReady, kMultiGet, kDone };

const char* step_name(Step step) {
  switch (step) {
    case Step::kIdle:
      return "not started";
    case Step::kConnecting:
      return "connecting";
    case Step::kHello:
      return "handshake";
    case Step::kSet:
      return "set";
    case Step::kReady:
      return "set done, multi_get not sent yet";
    case Step::kMultiGet:
      return "multi_get";
    case Step::kDone:
      return "done";
  }
  return "?";
}

std::string frame_of(const google::protobuf::MessageLite& message) {
  return hsgd::comm::encode_frame(message, kMaxReplyBytes, "rendezvous_bench");
}

struct Client {
  int fd = -1;
  Step step = Step::kIdle;
  std::string own_out;               // the Hello and set frames
  const std::string* out = nullptr;  // the frame being written: own_out or the shared multi_get
  size_t out_done = 0;
  bool want_write = false;  // EPOLLOUT registered
  std::array<uint8_t, kFrameHeaderBytes> header{};
  size_t header_got = 0;
  uint32_t length = 0;
  // Compared bytes of a streamed multi_get reply; or the bytes of a reply that is assembled
  // (small replies, FleetCheck::kProtobuf, a streamed reply after its first difference).
  size_t body_got = 0;
  std::string body;
  bool assemble = false;
};

class Fleet {
 public:
  explicit Fleet(const FleetOptions& options) : options_(options), clients_(options.count) {
    HSGD_CHECK(
        options.count >= 1 && options.first >= 0 && options.first + options.count <= options.world,
        "run_fleet: clients ", options.first, "..", options.first + options.count - 1,
        " are not within a world of ", options.world);
    epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
    HSGD_CHECK_AS(CommError, epoll_ >= 0, "run_fleet: epoll_create1: ", std::strerror(errno));
    build_frames();
    scratch_.resize(kScratchBytes);
  }

  ~Fleet() {
    for (Client& c : clients_) {
      if (c.fd >= 0) ::close(c.fd);
    }
    ::close(epoll_);
  }

  Fleet(const Fleet&) = delete;
  Fleet& operator=(const Fleet&) = delete;

  FleetTimes run() {
    const int window = options_.max_connecting > 0 ? options_.max_connecting : options_.count;
    const int waiting = options_.max_waiting > 0 ? options_.max_waiting : options_.count;
    while (next_ < options_.count && connecting_ < window) start(next_++);
    std::vector<epoll_event> events(1024);
    while (done_ < options_.count) {
      const auto now = Clock::now();
      if (now >= options_.deadline) throw_timeout();
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(options_.deadline - now).count();
      const int n = ::epoll_wait(epoll_, events.data(), static_cast<int>(events.size()),
                                 static_cast<int>(std::min<int64_t>(left + 1, 100)));
      HSGD_CHECK_AS(CommError, n >= 0 || errno == EINTR,
                    "run_fleet: epoll_wait: ", std::strerror(errno));
      for (int e = 0; e < n; ++e) on_event(events[e].data.u32, events[e].events);
      while (next_ < options_.count && connecting_ < window) start(next_++);
      while (!ready_.empty() && waiting_ < waiting) {
        const uint32_t i = ready_.front();
        ready_.pop_front();
        ++waiting_;
        send_shared(i, Step::kMultiGet, multi_get_frame_);
      }
    }
    return times_;
  }

 private:
  // The frames every client sends and the multi_get reply every client expects.
  void build_frames() {
    proto::Request multi_get;
    multi_get.set_id(2);
    multi_get.set_op(proto::OP_MULTI_GET);
    const auto budget = options_.deadline - Clock::now();
    multi_get.set_timeout_ms(std::max<int64_t>(
        1, std::chrono::duration_cast<std::chrono::milliseconds>(budget).count()));
    proto::Response expected;
    expected.set_id(2);
    for (int rank = 0; rank < options_.world; ++rank) {
      multi_get.add_keys("rank" + std::to_string(rank));
      values_.push_back(fleet_value(rank, options_.value_bytes));
      expected.add_values(values_.back());
    }
    multi_get_frame_ = hsgd::comm::encode_frame(multi_get, 1u << 30, "rendezvous_bench");
    expected_frame_ = hsgd::comm::encode_frame(expected, 1u << 30, "rendezvous_bench");
  }

  sockaddr_in address(uint32_t host, int port) const {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(host);
    return a;
  }

  void start(int i) {
    Client& c = clients_[i];
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) fail(i, std::string("socket: ") + std::strerror(errno));
    const int one = 1;
    ::setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // The port is chosen at connect(), for this destination, not at bind().
    ::setsockopt(c.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
    const uint64_t serial = options_.connection_serial + static_cast<uint64_t>(i);
    const uint32_t source = (127u << 24) | (2 + (serial / kClientsPerSourceAddress) % 250);
    const sockaddr_in from = address(source, 0);
    if (::bind(c.fd, reinterpret_cast<const sockaddr*>(&from), sizeof(from)) != 0) {
      fail(i, std::string("bind to a loopback source address: ") + std::strerror(errno));
    }
    const sockaddr_in to = address(INADDR_LOOPBACK, options_.port);
    if (::connect(c.fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) != 0 &&
        errno != EINPROGRESS) {
      fail(i, std::string("connect: ") + std::strerror(errno));
    }
    c.step = Step::kConnecting;
    c.want_write = true;
    epoll_event ev{.events = EPOLLIN | EPOLLOUT, .data = {.u32 = static_cast<uint32_t>(i)}};
    HSGD_CHECK_AS(CommError, ::epoll_ctl(epoll_, EPOLL_CTL_ADD, c.fd, &ev) == 0,
                  "run_fleet: epoll_ctl: ", std::strerror(errno));
    ++connecting_;
  }

  void on_event(uint32_t i, uint32_t events) {
    Client& c = clients_[i];
    if (c.step == Step::kConnecting) {
      int error = 0;
      socklen_t len = sizeof(error);
      ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &error, &len);
      if (error != 0) fail(i, std::string("connect: ") + std::strerror(error));
      if ((events & EPOLLOUT) == 0) return;
      proto::Hello hello;
      hello.set_magic(hsgd::comm::kProtocolMagic);
      hello.set_version(hsgd::comm::kProtocolVersion);
      hello.set_job_id(options_.job);
      char owner[33];
      std::snprintf(owner, sizeof(owner), "%032x", options_.first + i);
      hello.set_owner(owner);
      send(i, Step::kHello, frame_of(hello));
      return;
    }
    if ((events & EPOLLOUT) != 0 && c.out != nullptr) flush(i);
    if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0) receive(i);
  }

  void send(uint32_t i, Step next, std::string frame) {
    Client& c = clients_[i];
    c.own_out = std::move(frame);
    send_shared(i, next, c.own_out);
  }

  void send_shared(uint32_t i, Step next, const std::string& frame) {
    Client& c = clients_[i];
    c.step = next;
    c.out = &frame;
    c.out_done = 0;
    flush(i);
  }

  void flush(uint32_t i) {
    Client& c = clients_[i];
    while (c.out_done < c.out->size()) {
      const ssize_t n =
          ::send(c.fd, c.out->data() + c.out_done, c.out->size() - c.out_done, MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return watch(i, true);
      if (n < 0) fail(i, std::string("send: ") + std::strerror(errno));
      c.out_done += static_cast<size_t>(n);
    }
    c.out = nullptr;
    if (c.step == Step::kMultiGet) std::string().swap(c.own_out);
    watch(i, false);
  }

  void watch(uint32_t i, bool write) {
    Client& c = clients_[i];
    if (c.want_write == write) return;
    c.want_write = write;
    epoll_event ev{.events = EPOLLIN | (write ? EPOLLOUT : 0u), .data = {.u32 = i}};
    HSGD_CHECK_AS(CommError, ::epoll_ctl(epoll_, EPOLL_CTL_MOD, c.fd, &ev) == 0,
                  "run_fleet: epoll_ctl: ", std::strerror(errno));
  }

  // Reads what arrived; returns when the socket has no more or the client is done.
  void receive(uint32_t i) {
    Client& c = clients_[i];
    while (c.step != Step::kDone) {
      ssize_t n = 0;
      if (c.header_got < kFrameHeaderBytes) {
        n = ::recv(c.fd, c.header.data() + c.header_got, kFrameHeaderBytes - c.header_got, 0);
        if (!received(i, n)) return;
        c.header_got += static_cast<size_t>(n);
        if (c.header_got == kFrameHeaderBytes) start_body(i);
      } else if (c.assemble) {
        n = ::recv(c.fd, c.body.data() + c.body_got, c.length - c.body_got, 0);
        if (!received(i, n)) return;
        c.body_got += static_cast<size_t>(n);
      } else {
        n = ::recv(c.fd, scratch_.data(), std::min<size_t>(scratch_.size(), c.length - c.body_got),
                   0);
        if (!received(i, n)) return;
        compare(i, static_cast<size_t>(n));
      }
      if (c.header_got == kFrameHeaderBytes && c.body_got == c.length) on_frame(i);
    }
  }

  // False when nothing more can be read now; fails the client at end of stream or on an error.
  bool received(uint32_t i, ssize_t n) {
    if (n > 0) return true;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (n == 0) fail(i, "the server closed the connection");
    fail(i, std::string("recv: ") + std::strerror(errno));
  }

  void start_body(uint32_t i) {
    Client& c = clients_[i];
    c.length = hsgd::comm::decode_frame_header(c.header.data());
    if (c.length > kMaxReplyBytes) {
      fail(i, "a reply frame of " + std::to_string(c.length) + " bytes, above " +
                  std::to_string(kMaxReplyBytes));
    }
    c.body_got = 0;
    const bool streamed = c.step == Step::kMultiGet && options_.check == FleetCheck::kBytes &&
                          c.length + kFrameHeaderBytes == expected_frame_.size();
    c.assemble = !streamed;
    if (c.assemble) c.body.resize(c.length);
  }

  // Compares n streamed bytes (in scratch_) with the expected reply; at the first difference
  // the reply is assembled instead, so that on_frame() can say what came.
  void compare(uint32_t i, size_t n) {
    Client& c = clients_[i];
    const char* expected = expected_frame_.data() + kFrameHeaderBytes + c.body_got;
    if (std::memcmp(scratch_.data(), expected, n) != 0) {
      c.body.assign(expected_frame_, kFrameHeaderBytes, c.body_got);
      c.body.append(scratch_.data(), n);
      c.body.resize(c.length);
      c.assemble = true;
    }
    c.body_got += n;
  }

  void on_frame(uint32_t i) {
    Client& c = clients_[i];
    c.header_got = 0;
    switch (c.step) {
      case Step::kHello: {
        proto::HelloReply reply;
        if (!reply.ParseFromString(c.body) || !reply.accepted()) {
          fail(i, "handshake refused: " + reply.error());
        }
        times_.last_connected = Clock::now();
        --connecting_;
        const int rank = options_.first + static_cast<int>(i);
        proto::Request set;
        set.set_id(1);
        set.set_op(proto::OP_SET);
        set.add_keys("rank" + std::to_string(rank));
        set.add_values(values_[rank]);
        return send(i, Step::kSet, frame_of(set));
      }
      case Step::kSet: {
        proto::Response reply;
        if (!reply.ParseFromString(c.body) || reply.id() != 1 ||
            reply.status() != proto::STATUS_OK) {
          fail(i, "set: unexpected reply (id " + std::to_string(reply.id()) + ", status " +
                      std::to_string(reply.status()) + "): " + reply.error());
        }
        c.step = Step::kReady;  // run() sends the multi_get within max_waiting
        ready_.push_back(i);
        return;
      }
      case Step::kMultiGet:
        if (c.assemble) check_values(i);
        std::string().swap(c.body);
        c.step = Step::kDone;
        times_.last_done = Clock::now();
        ++done_;
        --waiting_;
        ::epoll_ctl(epoll_, EPOLL_CTL_DEL, c.fd, nullptr);  // open, but no longer watched
        return;
      default:
        fail(i, "a reply it did not ask for");
    }
  }

  // The multi_get reply, assembled: every value must be the one its rank published.
  void check_values(uint32_t i) {
    Client& c = clients_[i];
    proto::Response reply;
    if (!reply.ParseFromString(c.body)) fail(i, "multi_get: the reply does not parse");
    if (reply.id() != 2 || reply.status() != proto::STATUS_OK) {
      fail(i, "multi_get: reply id " + std::to_string(reply.id()) + ", status " +
                  std::to_string(reply.status()) + ": " + reply.error());
    }
    if (reply.values_size() != options_.world) {
      fail(i, "multi_get: " + std::to_string(reply.values_size()) + " values, expected " +
                  std::to_string(options_.world));
    }
    for (int rank = 0; rank < options_.world; ++rank) {
      if (reply.values(rank) != values_[rank]) {
        fail(i, "multi_get: value " + std::to_string(rank) + " differs from what rank" +
                    std::to_string(rank) + " published");
      }
    }
    if (options_.check == FleetCheck::kBytes) {
      fail(i, "multi_get: the values are right but the frame differs from protobuf's encoding");
    }
  }

  [[noreturn]] void fail(uint32_t i, const std::string& what) {
    HSGD_THROW(CommError, "rendezvous_bench: client ", options_.first + static_cast<int>(i), " of ",
               options_.world, " (step ", step_name(clients_[i].step), "): ", what);
  }

  [[noreturn]] void throw_timeout() {
    std::array<int, 7> in_step{};
    for (const Client& c : clients_) ++in_step[static_cast<size_t>(c.step)];
    std::string counts;
    for (size_t s = 0; s < in_step.size(); ++s) {
      if (in_step[s] == 0) continue;
      counts += (counts.empty() ? "" : ", ") + std::to_string(in_step[s]) + " " +
                step_name(static_cast<Step>(s));
    }
    HSGD_THROW(Timeout, "rendezvous_bench: clients ", options_.first, "..",
               options_.first + options_.count - 1, " not done by the deadline: ", counts);
  }

  const FleetOptions options_;
  int epoll_ = -1;
  std::vector<Client> clients_;
  std::vector<std::string> values_;  // by rank
  std::string multi_get_frame_;
  std::string expected_frame_;
  std::vector<char> scratch_;
  int next_ = 0;                // the next client to start
  int connecting_ = 0;          // started and not yet through the handshake
  int waiting_ = 0;             // multi_get sent and not yet answered
  std::deque<uint32_t> ready_;  // set answered, multi_get not sent yet
  int done_ = 0;
  FleetTimes times_{};
};

}  // namespace

std::string fleet_value(int rank, size_t value_bytes) {
  std::string value(value_bytes, '\0');
  const auto r = static_cast<uint32_t>(rank);
  for (size_t k = 0; k < value_bytes; ++k) {
    // The rank's 4 bytes first, then a pattern that differs between neighbouring ranks.
    value[k] = static_cast<char>(k < 4 ? r >> (8 * k) : (r * 31 + k * 7) & 0xff);
  }
  return value;
}

FleetTimes run_fleet(const FleetOptions& options) {
  Fleet fleet(options);
  return fleet.run();
}

}  // namespace hsgd::bench
