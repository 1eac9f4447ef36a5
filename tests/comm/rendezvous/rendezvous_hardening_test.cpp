// RendezvousServer with its default options against clients that misbehave: frames
// announced before the handshake, job ids that are too long or unprintable, per-job quotas on
// keys, bytes and pending waits, and timeouts too large for the clock. Every refusal must reach
// that client only, with a message naming the limit, while other clients keep being served.
// The limits themselves (small values, token tables) are tested in rendezvous_limits_test.cpp.

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "comm/error.h"
#include "comm/rendezvous/frame.h"
#include "comm/rendezvous/rendezvous_server.h"
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

void expect_serves(const RendezvousServer& server) {
  TcpStore store(client_options(server, "health"));
  store.set("alive", to_bytes("yes"));
  EXPECT_EQ(to_string(store.get("alive", 5s)), "yes");
}

std::string request_frame(uint64_t id, proto::Op op, std::vector<std::string> keys,
                          int64_t timeout_ms = 0) {
  proto::Request request;
  request.set_id(id);
  request.set_op(op);
  for (auto& key : keys) request.add_keys(key);
  request.set_timeout_ms(timeout_ms);
  return request.SerializeAsString();
}

proto::Response read_response(RawClient& raw, std::chrono::milliseconds timeout = 10s) {
  auto frame = raw.read_frame(timeout);
  EXPECT_TRUE(frame.has_value()) << "no response within " << timeout.count() << " ms";
  proto::Response response;
  if (frame) {
    EXPECT_TRUE(response.ParseFromString(*frame));
  }
  return response;
}

// The message of the CommError a TcpStore gets when the handshake of job is refused.
std::string refusal_of(const RendezvousServer& server, const std::string& job) {
  try {
    TcpStore store(client_options(server, job));
  } catch (const CommError& e) {
    return e.what();
  }
  return "";
}

// ---- 1. memory before login ----

// 00 80 00 00 announces 8 MiB. Before the handshake the server must not wait for (or allocate)
// such a frame: it refuses at once and closes, instead of holding the connection for the
// handshake timeout.
TEST(RendezvousHardeningTest, PreLoginFrameOverHandshakeLimit_IsRefusedAtOnce) {
  auto server = start_plain_server();
  RawClient raw(server->host(), server->port());
  const auto header = encode_frame_header(8u << 20);
  raw.send_bytes(std::string(header.begin(), header.end()));
  auto frame = raw.read_frame(5s);
  ASSERT_TRUE(frame.has_value()) << "no refusal within 5 s";
  proto::HelloReply reply;
  ASSERT_TRUE(reply.ParseFromString(*frame));
  EXPECT_FALSE(reply.accepted());
  EXPECT_NE(reply.error().find(std::to_string(8u << 20)), std::string::npos) << reply.error();
  EXPECT_TRUE(raw.closed_by_server(5s));
  expect_serves(*server);
}

// ---- 3. job ids and per-job quotas ----

// The server's rule, on a plain server (over TLS the client checks the id itself: the id is part
// of its identity, and a failed handshake cannot carry a reason).
TEST(RendezvousHardeningTest, JobIdLongerThan256Bytes_IsRefusedNamingTheLimit) {
  auto server = start_plain_server();
  const std::string what = refusal_of(*server, std::string(300, 'j'));
  EXPECT_NE(what.find("300 bytes"), std::string::npos) << what;
  EXPECT_NE(what.find("256"), std::string::npos) << what;
  // 256 bytes is still fine.
  TcpStore ok(client_options(*server, std::string(256, 'j')));
  EXPECT_TRUE(ok.ping());
}

TEST(RendezvousHardeningTest, JobIdEmptyOrUnprintable_IsRefused) {
  auto server = start_plain_server();
  for (const std::string& job :
       {std::string(), std::string("job\nINFO fake log line"), std::string("tab\tjob"),
        std::string("sp ace"), std::string("nul\0job", 7), std::string("\xc3\xa9t\xc3\xa9")}) {
    RawClient raw(server->host(), server->port());
    const auto reply = raw.hello(job);
    EXPECT_FALSE(reply.accepted()) << "job id of " << job.size() << " bytes";
    EXPECT_NE(reply.error().find("job id"), std::string::npos) << reply.error();
  }
  expect_serves(*server);
}

// A job id of 4 MiB (once logged at info level, 160 MB of log for 40 clients): the handshake frame
// alone is over the pre-login limit, so the connection goes without the server reading it.
TEST(RendezvousHardeningTest, HugeJobId_ConnectionClosedAndServerServes) {
  auto server = start_plain_server();
  RawClient raw(server->host(), server->port());
  proto::Hello hello;
  hello.set_magic(kProtocolMagic);
  hello.set_version(kProtocolVersion);
  hello.set_job_id(std::string(4 << 20, 'x'));
  const std::string payload = hello.SerializeAsString();
  const auto header = encode_frame_header(static_cast<uint32_t>(payload.size()));
  raw.send_bytes(std::string(header.begin(), header.end()));
  EXPECT_TRUE(raw.closed_by_server(5s));
  EXPECT_TRUE(eventually([&] { return server->num_connections() == 0; }, 5s));
  expect_serves(*server);
}

TEST(RendezvousHardeningTest, KeysPerJob_OverDefaultQuotaAreRefused_OtherJobsUnaffected) {
  auto server = start_server();
  TcpStore greedy(client_options(*server, "greedy"));
  TcpStore other(client_options(*server, "other"));
  other.set("mine", to_bytes("1"));
  // 65,536 keys per request (the per-request limit) twice: over the 100,000 keys of one job.
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  for (int i = 0; i < 65536; ++i) {
    std::string key = "a";  // not "a" + to_string(i): GCC 12 warns falsely (-Wrestrict)
    key += std::to_string(i);
    keys.push_back(key);
    values.push_back(to_bytes("v"));
  }
  greedy.multi_set(keys, values);
  for (auto& key : keys) key[0] = 'b';
  try {
    greedy.multi_set(keys, values);
    FAIL() << "131,072 keys in one job must break the per-job quota";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("100000 keys"), std::string::npos) << what;
    EXPECT_NE(what.find("greedy"), std::string::npos) << what;
  }
  EXPECT_EQ(greedy.num_keys(), 65536);
  // The refused client keeps its connection; the other job is untouched.
  EXPECT_TRUE(greedy.delete_key("a0"));
  greedy.set("a0", to_bytes("again"));
  EXPECT_EQ(to_string(other.get("mine", 5s)), "1");
  other.set("more", to_bytes("2"));
}

TEST(RendezvousHardeningTest, BytesPerJob_OverDefaultQuotaAreRefused) {
  auto server = start_server();
  TcpStore greedy(client_options(*server, "greedy"));
  const Bytes mib(1 << 20, 'x');
  int stored = 0;
  std::string what;
  for (int i = 0; i < 80 && what.empty(); ++i) {
    try {
      greedy.set("value" + std::to_string(i), mib);
      ++stored;
    } catch (const InvalidArgument& e) {
      what = e.what();
    }
  }
  // 64 MiB per job: the 64th MiB value (plus its key) no longer fits.
  EXPECT_EQ(stored, 63);
  EXPECT_NE(what.find("bytes"), std::string::npos) << what;
  EXPECT_NE(what.find(std::to_string(64 << 20)), std::string::npos) << what;
  // Overwriting a value with a smaller one, or deleting, is always possible.
  greedy.set("value0", to_bytes("small"));
  EXPECT_TRUE(greedy.delete_key("value1"));
  greedy.set("value63", mib);
  expect_serves(*server);
}

TEST(RendezvousHardeningTest, PendingWaitsPerJob_OverDefaultQuotaAreRefused) {
  auto server = start_plain_server();
  RawClient raw(server->host(), server->port());
  ASSERT_TRUE(raw.hello("waiter").accepted());
  constexpr int kQuota = 10000;
  std::string batch;
  for (int i = 0; i <= kQuota; ++i) {
    const std::string frame = request_frame(i + 1, proto::OP_WAIT, {"never"}, 60'000);
    const auto header = encode_frame_header(static_cast<uint32_t>(frame.size()));
    batch.append(header.begin(), header.end());
    batch += frame;
  }
  raw.send_bytes(batch);
  const auto response = read_response(raw);
  EXPECT_EQ(response.id(), static_cast<uint64_t>(kQuota + 1));
  EXPECT_EQ(response.status(), proto::STATUS_INVALID_ARGUMENT);
  EXPECT_NE(response.error().find("10000 pending waits"), std::string::npos) << response.error();
  EXPECT_EQ(server->num_pending_waits(), static_cast<size_t>(kQuota));
  // Another job may still wait.
  TcpStore other(client_options(*server, "other"));
  EXPECT_THROW(other.wait({"nothing"}, 100ms), Timeout);
  raw.close();
  EXPECT_TRUE(eventually([&] { return server->num_pending_waits() == 0; }));
}

// ---- 4. timeouts from a raw client ----

// A timeout beyond what the clock can add (9.2e12 ms is 292 years) once overflowed into "now":
// the server answered TIMEOUT at once. It must wait, and be woken by the key.
TEST(RendezvousHardeningTest, HugeTimeoutMs_WaitsInsteadOfTimingOutAtOnce) {
  auto server = start_plain_server();
  for (const int64_t timeout_ms :
       {int64_t{9'200'000'000'000}, std::numeric_limits<int64_t>::max()}) {
    const std::string key = "k" + std::to_string(timeout_ms);
    RawClient raw(server->host(), server->port());
    ASSERT_TRUE(raw.hello("clock").accepted());
    raw.send_frame(request_frame(7, proto::OP_GET, {key}, timeout_ms));
    EXPECT_FALSE(raw.read_frame(1s).has_value())
        << "timeout_ms " << timeout_ms << " was answered at once";
    TcpStore setter(client_options(*server, "clock"));
    setter.set(key, to_bytes("late"));
    const auto response = read_response(raw);
    EXPECT_EQ(response.status(), proto::STATUS_OK) << "timeout_ms " << timeout_ms;
    ASSERT_EQ(response.values_size(), 1);
    EXPECT_EQ(response.values(0), "late");
  }
  // A negative timeout still means "answer TIMEOUT now".
  RawClient raw(server->host(), server->port());
  ASSERT_TRUE(raw.hello("clock").accepted());
  raw.send_frame(request_frame(8, proto::OP_GET, {"absent"}, std::numeric_limits<int64_t>::min()));
  EXPECT_EQ(read_response(raw).status(), proto::STATUS_TIMEOUT);
}

}  // namespace
}  // namespace hsgd::comm
