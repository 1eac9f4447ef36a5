// hsgd's Gloo transport over TLS (comm/transport/tls_device.h): Gloo's algorithms give the same
// results over it as over Gloo's TCP transport; connections that do not authenticate are refused
// without taking the real peer's place; a peer that leaves fails its peers' waits naming it;
// nothing of the payload or the token crosses the wire in clear.

#include <arpa/inet.h>
#include <fcntl.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "comm/tls/tls.h"
#include "comm/transport/detail/tls_pair.h"
#include "comm/transport/detail/wire.h"
#include "comm/transport/tls_device.h"
#include "tests/support/multiprocess.h"
#include "tests/support/test_certificates.h"

namespace {

using namespace std::chrono_literals;
namespace transport = hsgd::comm::transport;
namespace tls = hsgd::comm::tls;
using hsgd::testing::run_ranks;
using hsgd::testing::run_ranks_in_threads;

constexpr char kToken[] = "data-plane-token-7f3a";
constexpr char kJob[] = "job-transport";

enum class Kind { kTls, kTcp };

std::shared_ptr<gloo::transport::Device> make_device(Kind kind) {
  if (kind == Kind::kTcp) {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    return gloo::transport::tcp::CreateDevice(attr);
  }
  return transport::create_tls_device(
      {.host = "127.0.0.1", .job_id = kJob, .token = kToken, .handshake_timeout = 1s});
}

// A gloo::Context over a transport context this test connected itself.
class MeshContext : public gloo::Context {
 public:
  MeshContext(int rank, int size, std::shared_ptr<gloo::transport::Device> device,
              std::shared_ptr<gloo::transport::Context> context)
      : gloo::Context(rank, size) {
    device_ = std::move(device);
    transportContext_ = std::move(context);
    setTimeout(20s);
  }
};

// `size` ranks in this process: their pairs created, then (connect()) connected in one thread
// per rank. Before connecting, a test may read or rewrite the addresses (address(from, to) is
// what rank `from` dials... or waits on, for its pair to `to`).
struct Mesh {
  Mesh(Kind kind, int size) : size(size) {
    for (int rank = 0; rank < size; ++rank) {
      devices.push_back(make_device(kind));
      transports.push_back(devices.back()->createContext(rank, size));
      transports.back()->setTimeout(20s);
      for (int peer = 0; peer < size; ++peer) {
        if (peer != rank) transports.back()->createPair(peer);
      }
    }
    addresses.assign(size, std::vector<std::vector<char>>(size));
    for (int from = 0; from < size; ++from) {
      for (int to = 0; to < size; ++to) {
        if (from != to) addresses[from][to] = transports[to]->getPair(from)->address().bytes();
      }
    }
  }

  void connect() {
    auto result = run_ranks_in_threads(size, 30s, [&](int rank) {
      for (int peer = 0; peer < size; ++peer) {
        if (peer != rank) transports[rank]->getPair(peer)->connect(addresses[rank][peer]);
      }
    });
    ASSERT_RANKS_OK(result);
    for (int rank = 0; rank < size; ++rank) {
      contexts.push_back(
          std::make_shared<MeshContext>(rank, size, devices[rank], transports[rank]));
    }
  }

  // The address of rank `to`'s pair for rank `from`.
  transport::detail::WireAddress wire(int from, int to) const {
    transport::detail::WireAddress wire;
    std::memcpy(&wire, addresses[from][to].data(), sizeof(wire));
    return wire;
  }

  int size;
  std::vector<std::shared_ptr<gloo::transport::Device>> devices;
  std::vector<std::shared_ptr<gloo::transport::Context>> transports;
  std::vector<std::vector<std::vector<char>>> addresses;  // [from][to]
  std::vector<std::shared_ptr<gloo::Context>> contexts;
};

// Rank r's input: integers, so that every summation order gives the same floats.
std::vector<float> input(int rank, size_t count) {
  std::vector<float> x(count);
  for (size_t i = 0; i < count; ++i)
    x[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 13 + 1));
  return x;
}

enum class Algorithm {
  kRing,
  kRingChunked,
  kHalvingDoubling,
  kUnboundRing,
  kBroadcast,
  kAllgather
};

const char* name(Algorithm a) {
  switch (a) {
    case Algorithm::kRing:
      return "AllreduceRing";
    case Algorithm::kRingChunked:
      return "AllreduceRingChunked";
    case Algorithm::kHalvingDoubling:
      return "AllreduceHalvingDoubling";
    case Algorithm::kUnboundRing:
      return "gloo::allreduce";
    case Algorithm::kBroadcast:
      return "gloo::broadcast";
    case Algorithm::kAllgather:
      return "gloo::allgather";
  }
  return "?";
}

// Runs algorithm on every rank of mesh; returns each rank's output.
std::vector<std::vector<float>> run(Mesh& mesh, Algorithm algorithm, size_t count) {
  std::vector<std::vector<float>> out(mesh.size);
  auto result = run_ranks_in_threads(mesh.size, 60s, [&](int rank) {
    auto& context = mesh.contexts[rank];
    std::vector<float> x = input(rank, count);
    switch (algorithm) {
      case Algorithm::kRing:
        gloo::AllreduceRing<float>(context, {x.data()}, static_cast<int>(count)).run();
        break;
      case Algorithm::kRingChunked:
        gloo::AllreduceRingChunked<float>(context, {x.data()}, static_cast<int>(count)).run();
        break;
      case Algorithm::kHalvingDoubling:
        gloo::AllreduceHalvingDoubling<float>(context, {x.data()}, static_cast<int>(count)).run();
        break;
      case Algorithm::kUnboundRing: {
        gloo::AllreduceOptions options(context);
        options.setOutput(x.data(), count);
        options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        void (*sum)(void*, const void*, const void*, size_t) = &gloo::sum<float>;
        options.setReduceFunction(sum);
        gloo::allreduce(options);
        break;
      }
      case Algorithm::kBroadcast: {
        gloo::BroadcastOptions options(context);
        options.setOutput(x.data(), count);
        options.setRoot(mesh.size - 1);
        gloo::broadcast(options);
        break;
      }
      case Algorithm::kAllgather: {
        std::vector<float> all(count * mesh.size);
        gloo::AllgatherOptions options(context);
        options.setInput(x.data(), count);
        options.setOutput(all.data(), all.size());
        gloo::allgather(options);
        x = all;
        break;
      }
    }
    gloo::BarrierOptions barrier(context);
    gloo::barrier(barrier);
    out[rank] = x;
  });
  EXPECT_RANKS_OK(result) << name(algorithm) << " of " << count << " floats";
  return out;
}

class TlsTransportAlgorithms : public ::testing::TestWithParam<int> {};

TEST_P(TlsTransportAlgorithms, SameResultsAsGlooTcp) {
  const int size = GetParam();
  Mesh tls_mesh(Kind::kTls, size);
  tls_mesh.connect();
  Mesh tcp_mesh(Kind::kTcp, size);
  tcp_mesh.connect();
  for (Algorithm algorithm :
       {Algorithm::kRing, Algorithm::kRingChunked, Algorithm::kHalvingDoubling,
        Algorithm::kUnboundRing, Algorithm::kBroadcast, Algorithm::kAllgather}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{(1 << 20) + 3}}) {
      if (count == 0 && algorithm != Algorithm::kUnboundRing &&
          algorithm != Algorithm::kBroadcast) {
        continue;  // Gloo's bound-buffer algorithms and allgather reject empty buffers
      }
      const auto over_tls = run(tls_mesh, algorithm, count);
      const auto over_tcp = run(tcp_mesh, algorithm, count);
      for (int rank = 0; rank < size; ++rank) {
        ASSERT_EQ(over_tls[rank].size(), over_tcp[rank].size());
        for (size_t i = 0; i < over_tls[rank].size(); ++i) {
          ASSERT_EQ(over_tls[rank][i], over_tcp[rank][i])
              << name(algorithm) << " of " << count << " floats, rank " << rank << ", index " << i;
        }
      }
      if (algorithm == Algorithm::kRing && count > 0) {  // and both are the sum
        const float ranks_sum = static_cast<float>(size * (size + 1) / 2);
        EXPECT_EQ(over_tls[0][count - 1], ranks_sum * static_cast<float>((count - 1) % 13 + 1));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, TlsTransportAlgorithms, ::testing::Values(2, 3, 5),
                         [](const auto& info) { return std::to_string(info.param) + "Ranks"; });

TEST(TlsTransportTest, ReceiveFromAnyOfSeveralRanks_TakesEachSenderOnce) {
  Mesh mesh(Kind::kTls, 4);
  mesh.connect();
  std::vector<int> sources;
  auto result = run_ranks_in_threads(4, 30s, [&](int rank) {
    auto& context = mesh.contexts[rank];
    int value = 100 + rank;
    auto buffer = context->createUnboundBuffer(&value, sizeof(value));
    if (rank != 0) {
      buffer->send(0, 7);
      buffer->waitSend();
      return;
    }
    for (int i = 0; i < 3; ++i) {
      buffer->recv(std::vector<int>{1, 2, 3}, 7);
      int source = -1;
      ASSERT_TRUE(buffer->waitRecv(&source));
      EXPECT_EQ(value, 100 + source) << "message " << i;
      sources.push_back(source);
    }
  });
  ASSERT_RANKS_OK(result);
  std::sort(sources.begin(), sources.end());
  EXPECT_EQ(sources, (std::vector<int>{1, 2, 3}));
}

// ---- refusals ----

int tcp_connect(const sockaddr_storage& address) {
  const int fd = ::socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const socklen_t length =
      address.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True when the peer closed fd (end-of-file or reset) within deadline.
bool closed_by_peer(int fd, std::chrono::milliseconds deadline) {
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  if (::poll(&p, 1, static_cast<int>(deadline.count())) != 1) return false;
  char byte;
  return ::recv(fd, &byte, 1, MSG_DONTWAIT) <= 0;
}

// A TLS client handshake as `identity` keyed by `token` on a new connection to address; returns
// whether it succeeded.
bool handshake_as(const sockaddr_storage& address, const std::string& identity,
                  const std::string& token, std::shared_ptr<tls::Context> context = nullptr) {
  const int fd = tcp_connect(address);
  if (fd < 0) return false;
  ::fcntl(fd, F_SETFL, O_NONBLOCK);
  bool ok = true;
  try {
    tls::Stream stream(fd, context ? context : tls::Context::client(), tls::Role::kClient);
    stream.set_client_psk(identity, tls::derive_psk(token, identity));
    stream.handshake(tls::Clock::now() + 5s);
    // TLS 1.3: the client finishes first; a refusal shows on the first read.
    char byte;
    stream.read_some(&byte, 1, tls::Clock::now() + 500ms);
  } catch (const tls::Failure& e) {
    ok = e.timed_out;  // nothing to read but not refused: the server accepted
  }
  ::close(fd);
  return ok;
}

TEST(TlsTransportTest, OutsidersAreRefusedAndTheRealPeerStillConnects) {
  Mesh mesh(Kind::kTls, 3);
  // Rank 2 waits for ranks 0 and 1: attack its pair for rank 0 before rank 0 dials.
  const auto target = mesh.wire(0, 2);
  const std::string real_name = transport::detail::connection_name(0, 2, target.pair_id);

  // 1. Random bytes first, the probe's attack; the connection stays open.
  const int garbage = tcp_connect(target.listen);
  ASSERT_GE(garbage, 0);
  std::mt19937 random(42);
  std::vector<char> noise(4096);
  for (char& c : noise) c = static_cast<char>(random());
  ASSERT_EQ(::send(garbage, noise.data(), noise.size(), MSG_NOSIGNAL), 4096);
  // 2. A client that connects and says nothing (a slow loris).
  const int silent = tcp_connect(target.listen);
  ASSERT_GE(silent, 0);
  // 3. The right identity with a wrong token; 4. the right token naming a pair that does not
  // exist, another rank, another job.
  EXPECT_FALSE(handshake_as(target.listen, tls::psk_identity("data", kJob, real_name), "wrong"));
  EXPECT_FALSE(
      handshake_as(target.listen,
                   tls::psk_identity("data", kJob,
                                     transport::detail::connection_name(0, 2, target.pair_id + 99)),
                   kToken));
  EXPECT_FALSE(handshake_as(
      target.listen,
      tls::psk_identity("data", kJob, transport::detail::connection_name(1, 2, target.pair_id)),
      kToken));
  EXPECT_FALSE(
      handshake_as(target.listen, tls::psk_identity("data", "other-job", real_name), kToken));
  EXPECT_TRUE(closed_by_peer(garbage, 5s)) << "the garbage connection was not closed";
  EXPECT_TRUE(closed_by_peer(silent, 5s)) << "the silent connection outlived the handshake timeout";
  ::close(garbage);
  ::close(silent);

  mesh.connect();
  const auto out = run(mesh, Algorithm::kUnboundRing, 1000);
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_EQ(out[rank].size(), 1000u);
    EXPECT_EQ(out[rank][999], 6.0f * (999 % 13 + 1)) << "rank " << rank;
  }
}

TEST(TlsTransportTest, WithCertificates_TheMeshConnectsAndStrangersAreRefused) {
  hsgd::testing::TestAuthority site("site");
  hsgd::testing::TestAuthority other("other");
  const tls::CertificateFiles node = site.issue("node");
  hsgd::testing::ScopedCertificateEnvironment env(node);  // every device of the mesh uses it
  Mesh mesh(Kind::kTls, 3);
  const auto target = mesh.wire(0, 2);
  const std::string identity = tls::psk_identity(
      "data", kJob, transport::detail::connection_name(0, 2, target.pair_id));
  // A host of the site without the token; the token with a certificate of another CA; the token
  // without a certificate.
  EXPECT_FALSE(handshake_as(target.listen, identity, "wrong"));
  tls::CertificateFiles stranger = other.issue("stranger");
  stranger.authority = node.authority;
  EXPECT_FALSE(handshake_as(target.listen, identity, kToken, tls::Context::client(stranger)));
  EXPECT_FALSE(
      handshake_as(target.listen, identity, kToken, tls::Context::client(std::nullopt)));

  mesh.connect();
  const auto out = run(mesh, Algorithm::kUnboundRing, (1 << 16) + 5);
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_EQ(out[rank].size(), (1u << 16) + 5);
    EXPECT_EQ(out[rank][1000], 6.0f * (1000 % 13 + 1)) << "rank " << rank;
  }
}

// ---- a peer that leaves ----

TEST(TlsTransportTest, PeerThatLeftFailsWaitsNamingIt) {
  const auto dir = hsgd::testing::unique_temp_dir("tls_transport");
  auto result = run_ranks(3, 30s, [&](int rank) {
    gloo::rendezvous::FileStore store(dir.string());
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, 3);
    context->setTimeout(60s);  // longer than the run: only the peer's exit can end the waits
    auto device = make_device(Kind::kTls);
    context->connectFullMesh(store, device);
    if (rank == 2) return;  // leaves: its process exits and its connections close
    int value = 0;
    auto buffer = context->createUnboundBuffer(&value, sizeof(value));
    buffer->recv(2, 1);
    try {
      buffer->waitRecv();
      ADD_FAILURE() << "rank " << rank << " received from a rank that left";
    } catch (const gloo::IoException& e) {
      EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    }
  });
  EXPECT_RANKS_OK(result);
}

TEST(TlsTransportTest, MessagesSentBeforeLeavingStillArrive) {
  Mesh mesh(Kind::kTls, 2);
  mesh.connect();
  const std::vector<char> payload(size_t{4} << 20, 'x');
  {
    // Rank 0 sends without waiting, drops the buffer and leaves (its context goes).
    auto buffer =
        mesh.contexts[0]->createUnboundBuffer(const_cast<char*>(payload.data()), payload.size());
    buffer->send(1, 9);
  }
  mesh.contexts[0].reset();
  mesh.transports[0].reset();
  std::vector<char> received(payload.size());
  auto buffer = mesh.contexts[1]->createUnboundBuffer(received.data(), received.size());
  buffer->recv(0, 9);
  EXPECT_TRUE(buffer->waitRecv());
  EXPECT_TRUE(received == payload) << "the message of the rank that left did not arrive whole";
}

TEST(TlsTransportTest, CloseFailsThePendingWaitsOfBothEnds) {
  Mesh mesh(Kind::kTls, 2);
  mesh.connect();
  std::atomic<bool> posted{false};
  auto result = run_ranks_in_threads(2, 30s, [&](int rank) {
    int value = 0;
    auto buffer = mesh.contexts[rank]->createUnboundBuffer(&value, sizeof(value));
    buffer->recv(1 - rank, 3);
    if (rank == 0) {
      while (!posted) std::this_thread::sleep_for(1ms);
      mesh.contexts[0]->closeConnections();
    } else {
      posted = true;
    }
    EXPECT_THROW(buffer->waitRecv(), gloo::IoException) << "rank " << rank;
  });
  EXPECT_RANKS_OK(result);
}

// A receive posted after its pair failed fails at once, naming the close, instead of waiting for
// the timeout (the context's 20 s): the failure happened before there was anything to fail.
TEST(TlsTransportTest, ReceivePostedAfterItsPairFailedFailsAtOnce) {
  Mesh mesh(Kind::kTls, 2);
  mesh.connect();
  mesh.contexts[0]->closeConnections();
  auto& pair = static_cast<transport::detail::TlsPair&>(*mesh.transports[1]->getPair(0));
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (pair.failure().empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_FALSE(pair.failure().empty()) << "rank 1 never saw rank 0 close";
  int value = 0;
  auto buffer = mesh.contexts[1]->createUnboundBuffer(&value, sizeof(value));
  buffer->recv(0, 5);
  try {
    buffer->waitRecv();
    ADD_FAILURE() << "a receive from a closed pair completed";
  } catch (const gloo::IoException& e) {
    EXPECT_EQ(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
  }
}

// A rank that closes its own connections fails its own send still waiting for the peer's
// acknowledgement with the close as the reason, whichever of close() and the pair's I/O thread
// gets there first (repeated, as the order varies from run to run).
TEST(TlsTransportTest, ClosingFailsThisRanksUnacknowledgedSendWithTheReason) {
  for (int round = 0; round < 20; ++round) {
    Mesh mesh(Kind::kTls, 2);
    mesh.connect();
    int value = round;
    auto buffer = mesh.contexts[0]->createUnboundBuffer(&value, sizeof(value));
    buffer->send(1, 7);  // rank 1 posts no receive: the send stays unacknowledged
    mesh.contexts[0]->closeConnections();
    try {
      buffer->waitSend();
      ADD_FAILURE() << "round " << round << ": a send nobody received completed";
    } catch (const gloo::IoException& e) {
      ASSERT_NE(std::string(e.what()).find("closed by rank 0"), std::string::npos)
          << "round " << round << ": " << e.what();
    }
  }
}

// ---- the wire ----

// Forwards one connection from its own port to `to`, recording what passes both ways.
class RecordingRelay {
 public:
  explicit RecordingRelay(const sockaddr_storage& to) : to_(to) {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    ::listen(listen_, 1);
    socklen_t length = sizeof(address_);
    ::getsockname(listen_, reinterpret_cast<sockaddr*>(&address_), &length);
    thread_ = std::thread([this] { run(); });
  }
  ~RecordingRelay() {
    stop_ = true;
    thread_.join();
    ::close(listen_);
  }
  const sockaddr_storage& address() const { return address_; }
  std::string recorded() {
    std::lock_guard<std::mutex> lock(mu_);
    return recorded_;
  }

 private:
  void run() {
    pollfd p{.fd = listen_, .events = POLLIN, .revents = 0};
    while (!stop_ && ::poll(&p, 1, 100) == 0) {
    }
    if (stop_) return;
    const int a = ::accept(listen_, nullptr, nullptr);
    const int b = tcp_connect(to_);
    char buffer[65536];
    while (!stop_) {
      pollfd fds[2] = {{.fd = a, .events = POLLIN, .revents = 0},
                       {.fd = b, .events = POLLIN, .revents = 0}};
      if (::poll(fds, 2, 100) <= 0) continue;
      bool closed = false;
      for (int i = 0; i < 2; ++i) {
        if (fds[i].revents == 0) continue;
        const ssize_t n = ::recv(fds[i].fd, buffer, sizeof(buffer), 0);
        if (n <= 0) {
          closed = true;
          break;
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          recorded_.append(buffer, static_cast<size_t>(n));
        }
        ::send(i == 0 ? b : a, buffer, static_cast<size_t>(n), MSG_NOSIGNAL);
      }
      if (closed) break;
    }
    ::close(a);
    ::close(b);
  }

  const sockaddr_storage to_;
  int listen_;
  sockaddr_storage address_{};
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::string recorded_;
};

TEST(TlsTransportTest, BytesOnTheWireContainNeitherPayloadNorToken) {
  Mesh mesh(Kind::kTls, 2);
  RecordingRelay relay(mesh.wire(0, 1).listen);
  auto rerouted = mesh.wire(0, 1);  // rank 0 dials rank 1 through the relay
  rerouted.listen = relay.address();
  std::memcpy(mesh.addresses[0][1].data(), &rerouted, sizeof(rerouted));
  mesh.connect();

  std::string payload;
  while (payload.size() < 200000) payload += "model-weights-in-clear-";
  std::string received(payload.size(), '\0');
  auto result = run_ranks_in_threads(2, 30s, [&](int rank) {
    auto& context = mesh.contexts[rank];
    if (rank == 0) {
      auto buffer = context->createUnboundBuffer(payload.data(), payload.size());
      buffer->send(1, 5);
      buffer->waitSend();
    } else {
      auto buffer = context->createUnboundBuffer(received.data(), received.size());
      buffer->recv(0, 5);
      buffer->waitRecv();
    }
    gloo::BarrierOptions barrier(context);
    gloo::barrier(barrier);
  });
  ASSERT_RANKS_OK(result);
  EXPECT_EQ(received, payload);
  const std::string wire = relay.recorded();
  EXPECT_GT(wire.size(), payload.size()) << "the payload did not pass through the relay";
  EXPECT_EQ(wire.find("model-weights"), std::string::npos);
  EXPECT_EQ(wire.find(kToken), std::string::npos);
}

}  // namespace
