// RendezvousServer: protocol robustness (handshake, refusals, malformed and oversized frames),
// job isolation, waits dropped on disconnect, IPv6, several I/O threads and many clients.
// Store semantics through the real client are in tests/comm/tcp_store.

#include "comm/rendezvous/rendezvous_server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/error.h"
#include "comm/rendezvous/frame.h"
#include "comm/rendezvous/tcp_store.h"
#include "tests/comm/rendezvous/rendezvous_test_util.h"

namespace hsgd::comm {
namespace {

using namespace std::chrono_literals;
using testing::eventually;
using testing::RawClient;
using testing::start_plain_server;

using testing::client_options;
using testing::start_server;

// A healthy client can still do a full round trip.
void expect_serves(const RendezvousServer& server) {
  TcpStore store(client_options(server, "health"));
  store.set("alive", to_bytes("yes"));
  EXPECT_EQ(to_string(store.get("alive", 5s)), "yes");
}

std::string request_frame(proto::Op op, std::vector<std::string> keys, int64_t timeout_ms = 0) {
  proto::Request request;
  request.set_id(1);
  request.set_op(op);
  for (auto& key : keys) request.add_keys(key);
  request.set_timeout_ms(timeout_ms);
  return request.SerializeAsString();
}

TEST(RendezvousServerTest, StartPicksFreePort_WhenPortIsZero) {
  auto server = start_server();
  EXPECT_GT(server->port(), 0);
  EXPECT_EQ(server->host(), "127.0.0.1");
  EXPECT_EQ(server->num_connections(), 0u);
  expect_serves(*server);
}

TEST(RendezvousServerTest, StartThrowsCommErrorNamingHostPort_WhenPortIsTaken) {
  auto first = start_server();
  RendezvousServer second({.port = first->port(), .token = testing::kTestToken});
  try {
    second.start();
    FAIL() << "binding a taken port must throw";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(first->port())),
              std::string::npos)
        << e.what();
  }
}

TEST(RendezvousServerTest, ConstructorRejectsBadOptions) {
  EXPECT_THROW(RendezvousServer({.threads = 0}), InvalidArgument);
  EXPECT_THROW(RendezvousServer({.port = 70000, .token = "test-token"}), InvalidArgument);
  EXPECT_THROW(RendezvousServer({.max_frame_bytes = 10}), InvalidArgument);
}

TEST(RendezvousServerTest, StopIsIdempotentAndClosesConnections) {
  auto server = start_plain_server();
  RawClient raw(server->host(), server->port());
  ASSERT_TRUE(raw.hello("job").accepted());
  ASSERT_TRUE(eventually([&] { return server->num_connections() == 1; }));
  server->stop();
  server->stop();
  EXPECT_TRUE(raw.closed_by_server());
  EXPECT_EQ(server->num_connections(), 0u);
}

// idle_job_ttl: a job's keys go once it has had no client for that long, not before, and a
// client that returns in time keeps them. Other jobs are untouched.
TEST(RendezvousServerTest, IdleJobKeysExpireUnlessAClientReturns) {
  auto server = start_server({.idle_job_ttl = 1500ms});
  TcpStore other(client_options(*server, "other"));  // stays connected throughout
  other.set("k", to_bytes("v"));
  {
    TcpStore gone(client_options(*server, "gone"));
    gone.set("k", to_bytes("v"));
  }
  ASSERT_TRUE(eventually([&] { return server->num_jobs() == 1; }, 10s))
      << server->num_jobs() << " jobs hold keys";
  TcpStore back_late(client_options(*server, "gone"));
  EXPECT_FALSE(back_late.check({"k"}));

  {
    TcpStore first(client_options(*server, "kept"));
    first.set("k", to_bytes("v"));
  }
  TcpStore second(client_options(*server, "kept"));  // back well within the ttl
  std::this_thread::sleep_for(2500ms);               // past the ttl, with a client connected
  EXPECT_TRUE(second.check({"k"})) << "a job with a client lost its keys";
  EXPECT_EQ(to_string(other.get("k", 5s)), "v");
}

TEST(RendezvousServerTest, HandshakeAnnouncesVersionAndLimits) {
  auto server = start_plain_server({.max_frame_bytes = 4096, .max_key_bytes = 100});
  RawClient raw(server->host(), server->port());
  const auto reply = raw.hello("job");
  EXPECT_TRUE(reply.accepted());
  EXPECT_EQ(reply.version(), kProtocolVersion);
  EXPECT_EQ(reply.max_frame_bytes(), 4096u);
  EXPECT_EQ(reply.max_key_bytes(), 100u);
}

TEST(RendezvousServerTest, RefusesBadMagic_AndKeepsServing) {
  auto server = start_plain_server();
  RawClient raw(server->host(), server->port());
  proto::Hello hello;
  hello.set_magic(0x12345678);
  hello.set_version(kProtocolVersion);
  raw.send_frame(hello.SerializeAsString());
  auto frame = raw.read_frame();
  ASSERT_TRUE(frame.has_value());
  proto::HelloReply reply;
  ASSERT_TRUE(reply.ParseFromString(*frame));
  EXPECT_FALSE(reply.accepted());
  EXPECT_NE(reply.error().find("magic"), std::string::npos) << reply.error();
  EXPECT_TRUE(raw.closed_by_server());
  expect_serves(*server);
}

TEST(RendezvousServerTest, RefusesOtherProtocolVersion_NamingBothVersions) {
  auto server = start_plain_server();
  RawClient raw(server->host(), server->port());
  const auto reply = raw.hello("job", kProtocolVersion + 7);
  EXPECT_FALSE(reply.accepted());
  EXPECT_NE(reply.error().find(std::to_string(kProtocolVersion + 7)), std::string::npos)
      << reply.error();
  EXPECT_NE(reply.error().find("version " + std::to_string(kProtocolVersion)), std::string::npos)
      << reply.error();
}

TEST(RendezvousServerTest, TokenRefusal_GivesClearClientError) {
  auto server = start_server({.token = "s3cret"});
  auto options = client_options(*server, "job", "");
  try {
    TcpStore store(options);
    FAIL() << "a client without a token must be refused before it connects";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("has no token"), std::string::npos) << e.what();
  }
  options.token = "wrong";
  try {
    TcpStore store(options);
    FAIL() << "a client with a wrong token must be refused";
  } catch (const CommError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("refused the TLS handshake"), std::string::npos) << what;
    EXPECT_NE(what.find(std::to_string(server->port())), std::string::npos) << what;
    EXPECT_EQ(what.find("wrong"), std::string::npos) << "the token is not in errors: " << what;
  }
  options.token = "s3cret";
  TcpStore store(options);
  store.set("k", to_bytes("v"));
  EXPECT_EQ(to_string(store.get("k", 5s)), "v");
}

TEST(RendezvousServerTest, MalformedFrame_ClosesOnlyThatConnection) {
  auto server = start_plain_server();
  TcpStore bystander(client_options(*server));
  RawClient raw(server->host(), server->port());
  ASSERT_TRUE(raw.hello("job").accepted());
  raw.send_frame(std::string("\xff\xff\xff\xff garbage that is no protobuf", 32));
  EXPECT_TRUE(raw.closed_by_server());
  bystander.set("after", to_bytes("1"));
  EXPECT_EQ(to_string(bystander.get("after", 5s)), "1");
  expect_serves(*server);
}

TEST(RendezvousServerTest, MalformedHandshake_ClosesConnection) {
  auto server = start_plain_server();
  RawClient raw(server->host(), server->port());
  raw.send_bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n");  // a port scanner or a browser
  EXPECT_TRUE(raw.closed_by_server());
  expect_serves(*server);
}

TEST(RendezvousServerTest, ConnectionWithoutHandshake_IsClosedAfterHandshakeTimeout) {
  auto server = start_server({.handshake_timeout = 200ms});
  RawClient silent(server->host(), server->port());
  EXPECT_TRUE(silent.closed_by_server());
  EXPECT_TRUE(eventually([&] { return server->num_connections() == 0; }));
  // A client that did its handshake is not affected by the timer.
  TcpStore store(client_options(*server));
  std::this_thread::sleep_for(400ms);
  EXPECT_TRUE(store.ping());
}

TEST(RendezvousServerTest, OversizedFrame_ClosesOnlyThatConnection) {
  auto server = start_plain_server({.max_frame_bytes = 4096});
  TcpStore bystander(client_options(*server));
  RawClient raw(server->host(), server->port());
  ASSERT_TRUE(raw.hello("job").accepted());
  // Only the header: the server must decide from the length alone, without buffering.
  const auto header = encode_frame_header(4097);
  raw.send_bytes(std::string(header.begin(), header.end()));
  EXPECT_TRUE(raw.closed_by_server());
  bystander.set("after", to_bytes("1"));
  EXPECT_EQ(to_string(bystander.get("after", 5s)), "1");
}

TEST(RendezvousServerTest, RequestBreakingKeyLimit_GetsInvalidArgumentAndConnectionStays) {
  auto server = start_plain_server({.max_key_bytes = 8});
  RawClient raw(server->host(), server->port());
  ASSERT_TRUE(raw.hello("job").accepted());
  raw.send_frame(request_frame(proto::OP_CHECK, {"this key is too long"}));
  auto frame = raw.read_frame();
  ASSERT_TRUE(frame.has_value());
  proto::Response response;
  ASSERT_TRUE(response.ParseFromString(*frame));
  EXPECT_EQ(response.status(), proto::STATUS_INVALID_ARGUMENT);
  EXPECT_NE(response.error().find("20 bytes"), std::string::npos) << response.error();
  raw.send_frame(request_frame(proto::OP_PING, {}));
  frame = raw.read_frame();
  ASSERT_TRUE(frame.has_value());
  ASSERT_TRUE(response.ParseFromString(*frame));
  EXPECT_EQ(response.status(), proto::STATUS_OK);
}

// Random bytes after a valid handshake: each frame either fails to parse (connection closed) or
// parses as some request (answered, possibly INVALID_ARGUMENT). Either way the server survives.
TEST(RendezvousServerTest, RandomFrames_ServerSurvives) {
  auto server = start_plain_server({.max_frame_bytes = 4096});
  std::mt19937 rng(12345);
  for (int round = 0; round < 200; ++round) {
    RawClient raw(server->host(), server->port());
    ASSERT_TRUE(raw.hello("fuzz").accepted());
    std::string payload(std::uniform_int_distribution<int>(0, 300)(rng), '\0');
    for (auto& c : payload) c = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
    raw.send_frame(payload);
  }
  expect_serves(*server);
  EXPECT_TRUE(eventually([&] { return server->num_pending_waits() == 0; }));
}

TEST(RendezvousServerTest, ReplyOverFrameLimit_GetsInvalidArgument) {
  auto server = start_server({.max_frame_bytes = 4096});
  TcpStore store(client_options(*server));
  for (const char* key : {"a", "b", "c"}) store.set(key, Bytes(2000, 'x'));
  try {
    store.multi_get({"a", "b", "c"}, 5s);
    FAIL() << "a 6 kB reply cannot fit a 4 kB frame";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("frame limit of 4096"), std::string::npos) << e.what();
  }
  EXPECT_EQ(store.get("a", 5s).size(), 2000u);
}

TEST(RendezvousServerTest, WrongArity_GetsInvalidArgument) {
  auto server = start_plain_server();
  RawClient raw(server->host(), server->port());
  ASSERT_TRUE(raw.hello("job").accepted());
  raw.send_frame(request_frame(proto::OP_SET, {"a", "b"}));  // two keys, no value
  auto frame = raw.read_frame();
  ASSERT_TRUE(frame.has_value());
  proto::Response response;
  ASSERT_TRUE(response.ParseFromString(*frame));
  EXPECT_EQ(response.status(), proto::STATUS_INVALID_ARGUMENT);
  EXPECT_NE(response.error().find("OP_SET"), std::string::npos) << response.error();
}

TEST(RendezvousServerTest, ClientDisconnectingWhileWaiting_DropsItsWaits) {
  auto server = start_plain_server();
  {
    RawClient raw(server->host(), server->port());
    ASSERT_TRUE(raw.hello("job").accepted());
    raw.send_frame(request_frame(proto::OP_WAIT, {"never", "set"}, 600'000));
    ASSERT_TRUE(eventually([&] { return server->num_pending_waits() == 1; }));
  }  // closes the socket with the wait pending
  EXPECT_TRUE(eventually([&] { return server->num_pending_waits() == 0; }));
  EXPECT_TRUE(eventually([&] { return server->num_connections() == 0; }));
  // Setting the key the dead client waited for must not touch its connection.
  TcpStore store(client_options(*server));
  store.set("never", to_bytes("x"));
  store.set("set", to_bytes("y"));
  EXPECT_EQ(to_string(store.get("never", 5s)), "x");
}

TEST(RendezvousServerTest, TwoJobsAreIsolated) {
  auto server = start_server();
  TcpStore a(client_options(*server, "job-a"));
  TcpStore b(client_options(*server, "job-b"));
  a.set("shared-name", to_bytes("from a"));
  b.set("shared-name", to_bytes("from b"));
  a.set("only-a", to_bytes("1"));
  EXPECT_EQ(to_string(a.get("shared-name", 5s)), "from a");
  EXPECT_EQ(to_string(b.get("shared-name", 5s)), "from b");
  EXPECT_FALSE(b.check({"only-a"}));
  EXPECT_EQ(a.num_keys(), 2);
  EXPECT_EQ(b.num_keys(), 1);
  EXPECT_THROW(b.get("only-a", 100ms), Timeout);
  EXPECT_EQ(b.add("counter", 5), 5);
  EXPECT_EQ(a.add("counter", 1), 1);
}

TEST(RendezvousServerTest, ServesOverIpv6Loopback) {
  auto server = std::make_unique<RendezvousServer>(
      RendezvousServerOptions{.host = "::1", .port = 0, .token = "t"});
  try {
    server->start();
  } catch (const CommError& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  TcpStore store({.host = "::1", .port = server->port(), .token = "t", .connect_timeout = 10s});
  EXPECT_EQ(store.endpoint(), "[::1]:" + std::to_string(server->port()));
  store.set("v6", to_bytes("ok"));
  EXPECT_EQ(to_string(store.get("v6", 5s)), "ok");
  TcpStore bracketed(
      {.host = "[::1]", .port = server->port(), .token = "t", .connect_timeout = 10s});
  EXPECT_EQ(to_string(bracketed.get("v6", 5s)), "ok");
}

// Many clients publish a key and wait for everyone's (Gloo's connect pattern), on a server with
// several I/O threads: every client must see every value.
TEST(RendezvousServerTest, ManyClientsAllToAll_WithSeveralThreads) {
  auto server = start_server({.threads = 3});
  constexpr int kClients = 64;
  std::vector<std::string> keys;
  for (int i = 0; i < kClients; ++i) keys.push_back("rank" + std::to_string(i));
  std::vector<std::thread> threads;
  std::atomic<int> correct = 0;
  std::vector<std::string> errors(kClients);
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      try {
        TcpStore store(client_options(*server, "all-to-all"));
        store.set(keys[i], to_bytes("addr-" + std::to_string(i)));
        auto values = store.multi_get(keys, 30s);
        bool ok = values.size() == keys.size();
        for (int j = 0; ok && j < kClients; ++j) {
          ok = to_string(values[j]) == "addr-" + std::to_string(j);
        }
        if (ok) ++correct;
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(errors[i], "") << "client " << i;
  EXPECT_EQ(correct.load(), kClients);
  EXPECT_EQ(server->num_pending_waits(), 0u);
}

}  // namespace
}  // namespace hsgd::comm
