// The rendezvous server's TLS (comm/rendezvous/rendezvous_server.h): what a recording relay on
// the path sees, and what outsiders without the job's token can do to a running job (nothing).

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/error.h"
#include "comm/rendezvous/rendezvous_server.h"
#include "comm/rendezvous/tcp_store.h"
#include "tests/comm/rendezvous/rendezvous_test_util.h"
#include "tests/support/test_certificates.h"

namespace hsgd::comm {
namespace {

using namespace std::chrono_literals;
using testing::client_options;
using testing::eventually;
using testing::RawClient;
using testing::start_server;

// Listens on 127.0.0.1 (a free port) and forwards every connection to target_port, recording
// every byte in both directions: what an observer on the link sees.
class RecordingRelay {
 public:
  explicit RecordingRelay(int target_port) : target_port_(target_port) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        ::listen(listener_, 16) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      throw std::runtime_error("RecordingRelay: cannot listen");
    }
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~RecordingRelay() {
    stop_ = true;
    thread_.join();
    ::close(listener_);
    for (const auto& [a, b] : pairs_) {
      ::close(a);
      ::close(b);
    }
  }
  RecordingRelay(const RecordingRelay&) = delete;
  RecordingRelay& operator=(const RecordingRelay&) = delete;

  int port() const { return port_; }
  std::string recorded() const {
    std::lock_guard lock(mu_);
    return recorded_;
  }

 private:
  int connect_target() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(target_port_));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }

  // One thread, poll() with a 20 ms tick so that stop_ ends it promptly.
  void serve() {
    while (!stop_) {
      std::vector<pollfd> fds{{.fd = listener_, .events = POLLIN, .revents = 0}};
      for (const auto& [a, b] : pairs_) {
        fds.push_back({.fd = a, .events = POLLIN, .revents = 0});
        fds.push_back({.fd = b, .events = POLLIN, .revents = 0});
      }
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
        const int server = client >= 0 ? connect_target() : -1;
        if (server >= 0) {
          pairs_.emplace_back(client, server);
        } else if (client >= 0) {
          ::close(client);
        }
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        const auto& pair = pairs_[(i - 1) / 2];
        const int from = fds[i].fd;
        const int to = from == pair.first ? pair.second : pair.first;
        char buffer[16384];
        const ssize_t n = ::recv(from, buffer, sizeof(buffer), MSG_DONTWAIT);
        if (n > 0) {
          {
            std::lock_guard lock(mu_);
            recorded_.append(buffer, static_cast<size_t>(n));
          }
          (void)::send(to, buffer, static_cast<size_t>(n), MSG_NOSIGNAL);
        } else if (n == 0) {
          ::shutdown(to, SHUT_WR);  // half-close: the other direction may still carry bytes
        }
      }
    }
  }

  const int target_port_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_ = false;
  std::vector<std::pair<int, int>> pairs_;  // touched by the relay thread only (and ~)
  mutable std::mutex mu_;
  std::string recorded_;  // guarded by mu_
  std::thread thread_;
};

constexpr char kToken[] = "relay-token-7f3a9c";
constexpr char kKey[] = "hsgd-run/node/secret-key-name";
constexpr char kValue[] = "10.1.2.3:4567 boot-id-8e41d2";

// Writes, reads, waits and adds through a relay; returns what the relay saw.
std::string traffic_through_relay(const RendezvousServer& server, const std::string& token) {
  RecordingRelay relay(server.port());
  auto options = client_options(server, "relay-job", token);
  options.port = relay.port();
  {
    TcpStore store(options);
    store.set(kKey, to_bytes(kValue));
    EXPECT_EQ(to_string(store.get(kKey, 5s)), kValue);
    EXPECT_EQ(store.add("counter-key-name", 3), 3);
    EXPECT_EQ(to_string(store.multi_get({kKey}, 5s).at(0)), kValue);
  }
  EXPECT_TRUE(eventually([&] { return server.num_connections() == 0; }));
  return relay.recorded();
}

TEST(RendezvousTlsTest, RelayedTraffic_CarriesNoTokenKeyOrValue) {
  auto server = start_server({.token = kToken});
  const std::string wire = traffic_through_relay(*server, kToken);
  ASSERT_GT(wire.size(), 500u) << "the relay recorded the handshakes and requests";
  EXPECT_EQ(wire.find(kToken), std::string::npos) << "the token crossed the wire";
  EXPECT_EQ(wire.find("secret-key-name"), std::string::npos) << "a key name crossed the wire";
  EXPECT_EQ(wire.find("counter-key-name"), std::string::npos) << "a key name crossed the wire";
  EXPECT_EQ(wire.find("boot-id-8e41d2"), std::string::npos) << "a value crossed the wire";
}

// The same traffic to an insecure server shows everything: the relay does record what passes.
TEST(RendezvousTlsTest, RelayedTraffic_ToInsecureServer_ShowsKeysAndValues) {
  auto server = testing::start_plain_server();
  const std::string wire = traffic_through_relay(*server, "");
  EXPECT_NE(wire.find("secret-key-name"), std::string::npos);
  EXPECT_NE(wire.find("boot-id-8e41d2"), std::string::npos);
}

TEST(RendezvousTlsTest, ServerNeedsATokenUnlessInsecure_AndInsecureTakesNone) {
  EXPECT_THROW(RendezvousServer({.port = 0}), InvalidArgument);
  EXPECT_THROW(RendezvousServer({.port = 0, .token = "t", .insecure = true}), InvalidArgument);
  EXPECT_NO_THROW(RendezvousServer({.port = 0, .insecure = true}));
  EXPECT_NO_THROW(RendezvousServer({.port = 0, .job_tokens = {{"j", "t"}}}));
}

// Certificates: the job's clients work and the wire shows nothing; a host of the site without
// the token, and a holder of the token with another CA's certificate, are refused at once.
TEST(RendezvousTlsTest, WithCertificates_TheJobWorks_StrangersAreRefusedAtOnce) {
  hsgd::testing::TestAuthority site("site");
  hsgd::testing::TestAuthority other("other");
  const tls::CertificateFiles host = site.issue("host");
  hsgd::testing::ScopedCertificateEnvironment env(host);
  auto server = start_server({.token = kToken});
  const std::string wire = traffic_through_relay(*server, kToken);
  ASSERT_GT(wire.size(), 500u);
  EXPECT_EQ(wire.find(kToken), std::string::npos) << "the token crossed the wire";
  EXPECT_EQ(wire.find("secret-key-name"), std::string::npos) << "a key name crossed the wire";
  EXPECT_EQ(wire.find("boot-id-8e41d2"), std::string::npos) << "a value crossed the wire";

  const auto refusal = [&](const std::string& token) -> std::string {
    const auto start = std::chrono::steady_clock::now();
    try {
      TcpStore store(client_options(*server, "relay-job", token));
      return "connected";
    } catch (const CommError& e) {
      // Final, not retried as an outage until the connect timeout (10 s).
      EXPECT_LT(std::chrono::steady_clock::now() - start, 8s) << e.what();
      return e.what();
    }
  };
  EXPECT_NE(refusal("wrong-token").find("refused identity"), std::string::npos);
  tls::CertificateFiles stranger = other.issue("stranger");
  stranger.authority = host.authority;
  {
    hsgd::testing::ScopedCertificateEnvironment as_stranger(stranger);
    EXPECT_NE(refusal(kToken).find("refused this client's certificate"), std::string::npos);
  }
  EXPECT_EQ(refusal(kToken), "connected");  // the site's certificate again
}

// A TLS client meeting a plain server (or an older one) is told at once, not after retries.
TEST(RendezvousTlsTest, TlsClientOfAnInsecureServer_IsRefusedSayingWhy) {
  auto server = testing::start_plain_server();
  auto options = client_options(*server, "job");
  options.insecure = false;
  options.token = "t";
  try {
    TcpStore store(options);
    ADD_FAILURE() << "a TLS client was served by a plain server";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("started insecure"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(eventually([&] { return server->num_connections() == 0; }));
}

// The probe's attack: outsiders without the job's token try to open the job and to write the
// failure record that restarts it. Every attempt is refused; the job's own clients, one of them
// waiting throughout, see nothing of it.
TEST(RendezvousTlsTest, Outsiders_AreRefused_AndTheJobIsUnaffected) {
  auto server = start_server({.job_tokens = {{"victim", "right-token"}, {"other", "other-token"}},
                              .handshake_timeout = 2s});
  TcpStore worker(client_options(*server, "victim", "right-token"));
  worker.set("before", to_bytes("1"));
  std::string waited;
  std::thread waiter([&] {
    TcpStore store(client_options(*server, "victim", "right-token"));
    waited = to_string(store.get("after", 60s));
  });
  ASSERT_TRUE(eventually([&] { return server->num_pending_waits() == 1; }));

  constexpr char kFailure[] = "hsgd-run/attempt/0/failed";
  auto attack = client_options(*server, "victim", "wrong-token");
  EXPECT_THROW(TcpStore(attack).set(kFailure, to_bytes("1")), CommError) << "a wrong token";
  attack.token = "other-token";  // another job's token: not this job's key
  EXPECT_THROW(TcpStore(attack).set(kFailure, to_bytes("1")), CommError) << "another job's token";
  attack.token = "";
  EXPECT_THROW(TcpStore(attack).set(kFailure, to_bytes("1")), InvalidArgument) << "no token";
  attack.insecure = true;  // the plain protocol: a refusal that says TLS is required
  try {
    TcpStore(attack).set(kFailure, to_bytes("1"));
    ADD_FAILURE() << "a plain client was admitted";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("only TLS"), std::string::npos) << e.what();
  }
  // Random bytes, starting like a TLS record and not.
  std::mt19937 random(7);
  for (const char first : {char{22}, char{'G'}}) {
    RawClient raw(server->host(), server->port());
    std::string noise(4096, '\0');
    for (char& c : noise) c = static_cast<char>(random());
    noise[0] = first;
    raw.send_bytes(noise);
    EXPECT_TRUE(raw.closed_by_server(10s)) << "random bytes starting with " << int(first);
  }
  // Too slow: the start of a handshake, then silence, is closed at the handshake deadline.
  {
    RawClient slow(server->host(), server->port());
    slow.send_bytes(std::string(1, char{22}));
    EXPECT_TRUE(slow.closed_by_server(20s));
  }

  EXPECT_FALSE(worker.check({kFailure})) << "an outsider wrote the failure record";
  EXPECT_EQ(worker.num_keys(), 1);
  worker.set("after", to_bytes("2"));
  waiter.join();
  EXPECT_EQ(waited, "2") << "the waiting client was not disturbed";
  EXPECT_TRUE(eventually([&] { return server->num_connections() == 1; }))
      << "refused connections are all closed; " << server->num_connections() << " open";
  EXPECT_EQ(server->unauthenticated_bytes(), 0u);
}

}  // namespace
}  // namespace hsgd::comm
