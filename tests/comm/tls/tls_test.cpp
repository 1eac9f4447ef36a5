#include "comm/tls/tls.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace tls = hsgd::comm::tls;

namespace {

using namespace std::chrono_literals;

struct SocketPair {
  int client = -1;
  int server = -1;
  SocketPair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
    client = fds[0];
    server = fds[1];
  }
  ~SocketPair() {
    ::close(client);
    ::close(server);
  }
};

tls::Clock::time_point in(std::chrono::milliseconds ms) { return tls::Clock::now() + ms; }

// A server whose only job is "job42" with token "secret-42".
std::shared_ptr<tls::Context> job42_server() {
  return tls::Context::server([](std::string_view identity) -> std::optional<tls::Psk> {
    if (tls::identity_job(identity) != "job42") return std::nullopt;
    return tls::derive_psk("secret-42", identity);
  });
}

// Runs the server's handshake on its own thread; returns its error text ("" on success) and the
// identity it authenticated.
struct ServerResult {
  std::string error;
  std::string identity;
  std::string received;
};

ServerResult serve(int fd, std::shared_ptr<tls::Context> context, size_t expect_bytes) {
  ServerResult result;
  try {
    tls::Stream stream(fd, std::move(context), tls::Role::kServer);
    stream.handshake(in(5s));
    result.identity = stream.peer_identity();
    result.received.resize(expect_bytes);
    stream.read_exact(result.received.data(), expect_bytes, in(5s));
    stream.write_all("ok", 2, in(5s));
  } catch (const tls::Failure& failure) {
    result.error = failure.what();
  }
  return result;
}

TEST(TlsTest, DerivedKeysDependOnTokenAndIdentity) {
  const std::string id = tls::psk_identity("store", "job42", "node-a");
  EXPECT_EQ(id, "hsgd1 store job42 node-a");
  EXPECT_EQ(tls::derive_psk("t", id), tls::derive_psk("t", id));
  EXPECT_NE(tls::derive_psk("t", id), tls::derive_psk("u", id));
  EXPECT_NE(tls::derive_psk("t", id), tls::derive_psk("t", tls::psk_identity("store", "job42", "node-b")));
  EXPECT_THROW(tls::derive_psk("", id), tls::Failure);
}

TEST(TlsTest, IdentityJobParsesOnlyWellFormedIdentities) {
  EXPECT_EQ(tls::identity_job("hsgd1 store job42 node-a"), "job42");
  EXPECT_EQ(tls::identity_job("hsgd1 data j rank 3 -> 5"), "j");
  EXPECT_EQ(tls::identity_job("hsgd2 store job42 x"), std::nullopt);
  EXPECT_EQ(tls::identity_job("hsgd1 store"), std::nullopt);
  EXPECT_EQ(tls::identity_job("hsgd1  job42 x"), std::nullopt);
}

TEST(TlsTest, ClientWithTheTokenConnectsAndTheServerLearnsItsIdentity) {
  SocketPair sockets;
  const auto server = job42_server();
  ServerResult result;
  std::thread server_thread([&] { result = serve(sockets.server, server, 11); });
  tls::Stream client(sockets.client, tls::Context::client(), tls::Role::kClient);
  const std::string id = tls::psk_identity("store", "job42", "node-a");
  client.set_client_psk(id, tls::derive_psk("secret-42", id));
  client.handshake(in(5s));
  client.write_all("hello world", 11, in(5s));
  char reply[2];
  client.read_exact(reply, 2, in(5s));
  server_thread.join();
  EXPECT_EQ(result.error, "");
  EXPECT_EQ(result.identity, id);
  EXPECT_EQ(result.received, "hello world");
  EXPECT_EQ(std::string(reply, 2), "ok");
}

TEST(TlsTest, WrongTokenFailsTheHandshakeOnBothSides) {
  SocketPair sockets;
  ServerResult result;
  std::thread server_thread([&] { result = serve(sockets.server, job42_server(), 1); });
  tls::Stream client(sockets.client, tls::Context::client(), tls::Role::kClient);
  const std::string id = tls::psk_identity("store", "job42", "node-a");
  client.set_client_psk(id, tls::derive_psk("guessed", id));
  EXPECT_THROW(client.handshake(in(5s)), tls::Failure);
  server_thread.join();
  EXPECT_NE(result.error, "");
  EXPECT_EQ(result.identity, "");
  EXPECT_EQ(result.received, "");
}

TEST(TlsTest, KeyOfOneIdentityDoesNotOpenAnother) {
  SocketPair sockets;
  ServerResult result;
  std::thread server_thread([&] { result = serve(sockets.server, job42_server(), 1); });
  tls::Stream client(sockets.client, tls::Context::client(), tls::Role::kClient);
  const std::string claimed = tls::psk_identity("store", "job42", "node-b");
  const std::string held = tls::psk_identity("store", "job42", "node-a");
  client.set_client_psk(claimed, tls::derive_psk("secret-42", held));
  EXPECT_THROW(client.handshake(in(5s)), tls::Failure);
  server_thread.join();
  EXPECT_NE(result.error, "");
}

TEST(TlsTest, UnknownJobAndClientWithoutKeyAreRefused) {
  for (const bool with_key : {true, false}) {
    SocketPair sockets;
    ServerResult result;
    std::thread server_thread([&] { result = serve(sockets.server, job42_server(), 1); });
    tls::Stream client(sockets.client, tls::Context::client(), tls::Role::kClient);
    if (with_key) {
      const std::string id = tls::psk_identity("store", "job7", "node-a");
      client.set_client_psk(id, tls::derive_psk("secret-42", id));
    }
    EXPECT_THROW(client.handshake(in(5s)), tls::Failure) << "with_key " << with_key;
    server_thread.join();
    EXPECT_NE(result.error, "") << "with_key " << with_key;
  }
}

TEST(TlsTest, GarbageInsteadOfAHandshakeFailsTheServerQuickly) {
  SocketPair sockets;
  ServerResult result;
  std::thread server_thread([&] { result = serve(sockets.server, job42_server(), 1); });
  std::vector<char> garbage(512);
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>(i * 37 + 11);
  ASSERT_EQ(::send(sockets.client, garbage.data(), garbage.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(garbage.size()));
  server_thread.join();
  EXPECT_NE(result.error, "");
  EXPECT_EQ(result.error.find("deadline"), std::string::npos) << result.error;
}

TEST(TlsTest, SilentPeerHitsTheDeadline) {
  SocketPair sockets;
  tls::Stream client(sockets.client, tls::Context::client(), tls::Role::kClient);
  const std::string id = tls::psk_identity("store", "job42", "node-a");
  client.set_client_psk(id, tls::derive_psk("secret-42", id));
  try {
    client.handshake(in(200ms));
    FAIL() << "the handshake completed with nobody answering";
  } catch (const tls::Failure& failure) {
    EXPECT_TRUE(failure.timed_out) << failure.what();
  }
}

TEST(TlsTest, RecordsOnTheWireDoNotContainThePlaintextOrTheToken) {
  SocketPair sockets;
  int tap[2];  // the client writes into tap[0]; the test copies tap[1] -> server, recording it
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, tap), 0);
  ServerResult result;
  const std::string secret_text = "weights-and-keys-0123456789";
  std::thread server_thread(
      [&] { result = serve(sockets.server, job42_server(), secret_text.size()); });
  std::string recorded;
  std::atomic<bool> stop{false};
  std::thread relay([&] {
    // Forwards tap[1] <-> sockets.client both ways, keeping what the client sent.
    char buffer[4096];
    while (!stop) {
      bool moved = false;
      ssize_t n = ::recv(tap[1], buffer, sizeof(buffer), 0);
      if (n > 0) {
        recorded.append(buffer, static_cast<size_t>(n));
        ::send(sockets.client, buffer, static_cast<size_t>(n), MSG_NOSIGNAL);
        moved = true;
      }
      n = ::recv(sockets.client, buffer, sizeof(buffer), 0);
      if (n > 0) {
        ::send(tap[1], buffer, static_cast<size_t>(n), MSG_NOSIGNAL);
        moved = true;
      }
      if (!moved) std::this_thread::sleep_for(1ms);
    }
  });
  {
    tls::Stream client(tap[0], tls::Context::client(), tls::Role::kClient);
    const std::string id = tls::psk_identity("store", "job42", "node-a");
    client.set_client_psk(id, tls::derive_psk("secret-42", id));
    client.handshake(in(5s));
    client.write_all(secret_text.data(), secret_text.size(), in(5s));
    char reply[2];
    client.read_exact(reply, 2, in(5s));
  }
  server_thread.join();
  stop = true;
  relay.join();
  ::close(tap[0]);
  ::close(tap[1]);
  EXPECT_EQ(result.received, secret_text);
  EXPECT_GT(recorded.size(), secret_text.size());
  EXPECT_EQ(recorded.find(secret_text), std::string::npos);
  EXPECT_EQ(recorded.find("secret-42"), std::string::npos);
}

}  // namespace
