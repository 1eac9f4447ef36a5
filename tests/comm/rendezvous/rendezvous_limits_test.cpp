// The limits of RendezvousServer set small: the pre-login byte budget, the connection
// cap, per-job quotas, the job count, per-job tokens; and the pieces they are built from,
// FrameDecoder and the token-file rule. The defaults are tested in rendezvous_hardening_test.cpp.

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/error.h"
#include "comm/rendezvous/frame.h"
#include "comm/rendezvous/rendezvous_server.h"
#include "comm/rendezvous/rendezvous_server_tokens.h"
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

std::string hello_payload(const std::string& job) {
  proto::Hello hello;
  hello.set_magic(kProtocolMagic);
  hello.set_version(kProtocolVersion);
  hello.set_job_id(job);
  return hello.SerializeAsString();
}

std::string with_header(const std::string& payload) {
  const auto header = encode_frame_header(static_cast<uint32_t>(payload.size()));
  return std::string(header.begin(), header.end()) + payload;
}

// ---- FrameDecoder ----

TEST(FrameDecoderTest, HoldsOnlyWhatArrived_NotWhatTheHeaderClaims) {
  FrameDecoder decoder(16u << 20);
  const auto header = encode_frame_header(8u << 20);
  const std::string bytes = std::string(header.begin(), header.end()) + "0123456789";
  const size_t taken = decoder.feed({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
  EXPECT_EQ(taken, bytes.size());
  EXPECT_EQ(decoder.state(), FrameDecoder::State::kNeedMore);
  EXPECT_EQ(decoder.announced(), 8u << 20);
  EXPECT_EQ(decoder.buffered_bytes(), 14u);
  EXPECT_EQ(decoder.wanted(), (8u << 20) - 10);
  EXPECT_LT(decoder.frame().capacity(), 4096u);
}

TEST(FrameDecoderTest, OversizedHeader_IsReportedBeforeAnyBodyByte) {
  FrameDecoder decoder(100);
  const auto header = encode_frame_header(101);
  const std::string bytes = std::string(header.begin(), header.end()) + "body";
  EXPECT_EQ(decoder.feed({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}), 4u);
  EXPECT_EQ(decoder.state(), FrameDecoder::State::kOversized);
  EXPECT_EQ(decoder.announced(), 101u);
}

TEST(FrameDecoderTest, FramesByteByByte_ThenTheLimitChanges) {
  FrameDecoder decoder(8);
  const std::string stream = with_header("abc") + with_header("") + with_header("0123456789");
  std::vector<std::string> frames;
  bool oversized = false;
  for (size_t i = 0; i < stream.size() && !oversized; ++i) {
    decoder.feed({reinterpret_cast<const uint8_t*>(stream.data()) + i, 1});
    if (decoder.state() == FrameDecoder::State::kFrame) {
      frames.push_back(decoder.frame());
      decoder.next();
    }
    oversized = decoder.state() == FrameDecoder::State::kOversized;
  }
  EXPECT_EQ(frames, (std::vector<std::string>{"abc", ""}));
  EXPECT_TRUE(oversized) << "a 10-byte frame is over the limit of 8";
  decoder = FrameDecoder(8);
  decoder.set_limit(16);
  const std::string big = with_header("0123456789");
  decoder.feed({reinterpret_cast<const uint8_t*>(big.data()), big.size()});
  ASSERT_EQ(decoder.state(), FrameDecoder::State::kFrame);
  EXPECT_EQ(decoder.frame(), "0123456789");
}

// ---- token file rule ----

TEST(TokenFileTest, OneRule_CommentsBlanksCrlfTabs) {
  const auto table = parse_token_file(
      "# tokens of the cluster\r\n\n  server-tok \t\r\njob-a\ttok-a\r\n job-b   tok-b  \n", "f");
  EXPECT_EQ(table.server_token, "server-tok");
  EXPECT_EQ(table.job_tokens.size(), 2u);
  EXPECT_EQ(table.token_for("job-a"), "tok-a");
  EXPECT_EQ(table.token_for("job-b"), "tok-b");
  EXPECT_EQ(table.token_for("job-z"), "server-tok");
  EXPECT_TRUE(table.admits("job-a", "tok-a"));
  EXPECT_FALSE(table.admits("job-a", "server-tok")) << "job-a has its own token";
  EXPECT_TRUE(table.admits("job-z", "server-tok"));
  EXPECT_FALSE(table.admits("job-b", "tok-a"));
  EXPECT_FALSE(table.admits("job-z", "tok-a"));
  EXPECT_FALSE(table.admits("job-a", ""));
  // A plain one-token file, as `echo secret > f` writes it.
  EXPECT_EQ(parse_token_file("secret\n", "f").token_for("any"), "secret");
}

TEST(TokenFileTest, MalformedFiles_NameFileAndLine) {
  struct Case {
    const char* text;
    const char* expected;
  };
  for (const Case& c : {Case{"a b c\n", "f, line 1: expected 'TOKEN' or 'JOB_ID TOKEN'"},
                        Case{"one\n#\ntwo\n", "f, line 3: a second server-wide token"},
                        Case{"j t1\nj t2\n", "f, line 2: job 'j' is listed twice"},
                        Case{"\n# nothing\n", "f holds no token"},
                        Case{"j tok\x01\n", "f, line 1: a token with the byte \\x01"},
                        Case{"", "f holds no token"}}) {
    try {
      parse_token_file(c.text, "f");
      ADD_FAILURE() << "accepted: '" << c.text << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(c.expected), std::string::npos) << e.what();
    }
  }
  const auto per_job = parse_token_file("job-a tok-a\n", "f");
  try {
    per_job.token_for("job-b", "--token-file 'f'");
    ADD_FAILURE() << "job-b has no token";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no line for job 'job-b'"), std::string::npos) << e.what();
  }
}

// ---- the server's limits ----

TEST(RendezvousLimitsTest, ConstructorRejectsBadLimits) {
  EXPECT_THROW(RendezvousServer({.max_keys_per_job = 0}), InvalidArgument);
  EXPECT_THROW(RendezvousServer({.max_handshake_bytes = 10}), InvalidArgument);
  EXPECT_THROW(RendezvousServer({.max_handshake_bytes = 4096, .max_unauthenticated_bytes = 100}),
               InvalidArgument);
  EXPECT_THROW(RendezvousServer({.job_tokens = {{"bad job", "t"}}}), InvalidArgument);
  EXPECT_THROW(RendezvousServer({.job_tokens = {{"job", ""}}}), InvalidArgument);
}

// Handshakes that arrive slowly share one byte budget: beyond it new ones are refused, and a
// completed handshake gives its bytes back.
TEST(RendezvousLimitsTest, UnauthenticatedBytes_AreBoundedAndReleased) {
  auto server = start_plain_server({.max_handshake_bytes = 256, .max_unauthenticated_bytes = 512});
  const std::string frame = with_header(hello_payload(std::string(180, 'j')));
  ASSERT_GT(frame.size(), 180u);
  ASSERT_LT(frame.size(), 256u);
  const size_t part = 150;  // what each slow client sends of its handshake
  std::vector<std::unique_ptr<RawClient>> slow;
  for (int i = 0; i < 3; ++i) {
    slow.push_back(std::make_unique<RawClient>(server->host(), server->port()));
    slow.back()->send_bytes(frame.substr(0, part));
  }
  ASSERT_TRUE(eventually([&] { return server->unauthenticated_bytes() == 3 * part; }))
      << server->unauthenticated_bytes();
  RawClient over(server->host(), server->port());
  over.send_bytes(frame.substr(0, part));
  const auto refusal = over.read_frame(10s);
  ASSERT_TRUE(refusal.has_value());
  proto::HelloReply reply;
  ASSERT_TRUE(reply.ParseFromString(*refusal));
  EXPECT_FALSE(reply.accepted());
  EXPECT_NE(reply.error().find("incomplete handshakes"), std::string::npos) << reply.error();
  EXPECT_LE(server->unauthenticated_bytes(), 512u);
  // The slow clients finish their handshakes: accepted, and their bytes released.
  for (auto& client : slow) {
    client->send_bytes(frame.substr(part));
    const auto accepted = client->read_frame(10s);
    ASSERT_TRUE(accepted.has_value());
    ASSERT_TRUE(reply.ParseFromString(*accepted));
    EXPECT_TRUE(reply.accepted()) << reply.error();
  }
  EXPECT_TRUE(eventually([&] { return server->unauthenticated_bytes() == 0; }))
      << server->unauthenticated_bytes();
}

TEST(RendezvousLimitsTest, ConnectionCap_NewClientWaitsUntilOneCloses) {
  auto server = start_plain_server({.max_connections = 2});
  EXPECT_EQ(server->max_connections(), 2u);
  auto first = std::make_unique<RawClient>(server->host(), server->port());
  ASSERT_TRUE(first->hello("cap").accepted());
  RawClient second(server->host(), server->port());
  ASSERT_TRUE(second.hello("cap").accepted());
  RawClient third(server->host(), server->port());  // the kernel completes the connect
  third.send_frame(hello_payload("cap"));
  EXPECT_FALSE(third.read_frame(500ms).has_value()) << "a third connection was served";
  EXPECT_EQ(server->num_connections(), 2u);
  first.reset();
  const auto frame = third.read_frame(10s);
  ASSERT_TRUE(frame.has_value()) << "the waiting client was not accepted after one closed";
  proto::HelloReply reply;
  ASSERT_TRUE(reply.ParseFromString(*frame));
  EXPECT_TRUE(reply.accepted());
}

TEST(RendezvousLimitsTest, DefaultConnectionCap_ComesFromTheFdLimit) {
  auto server = start_server();
  EXPECT_GT(server->max_connections(), 0u);
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_cur != RLIM_INFINITY) {
    EXPECT_LT(server->max_connections(), limit.rlim_cur);
  }
}

TEST(RendezvousLimitsTest, SmallQuotas_RefuseThatJobOnly) {
  auto server = start_plain_server({.max_keys_per_job = 3, .max_waits_per_job = 1, .max_jobs = 2});
  TcpStore a(client_options(*server, "job-a"));
  TcpStore b(client_options(*server, "job-b"));
  for (const char* key : {"k1", "k2", "k3"}) a.set(key, to_bytes("v"));
  EXPECT_THROW(a.set("k4", to_bytes("v")), InvalidArgument);
  a.set("k1", to_bytes("overwrite is fine"));
  EXPECT_THROW(a.add("counter", 1), InvalidArgument);
  b.set("k1", to_bytes("b"));
  // One pending wait per job: a second one is refused at once, not after its timeout.
  RawClient waiter(server->host(), server->port());
  ASSERT_TRUE(waiter.hello("job-b").accepted());
  proto::Request wait;
  wait.set_id(5);
  wait.set_op(proto::OP_WAIT);
  wait.add_keys("later");
  wait.set_timeout_ms(30'000);
  waiter.send_frame(wait.SerializeAsString());
  ASSERT_TRUE(eventually([&] { return server->num_pending_waits() == 1; }));
  try {
    b.wait({"other"}, 10s);
    FAIL() << "a second pending wait in job-b must be refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("1 pending waits"), std::string::npos) << e.what();
  }
  // job-a's waits are its own.
  EXPECT_THROW(a.wait({"absent"}, 100ms), Timeout);
  // Two jobs at most: a third job cannot add keys; the two others continue.
  TcpStore c(client_options(*server, "job-c"));
  try {
    c.set("k", to_bytes("v"));
    FAIL() << "a third job must be refused";
  } catch (const InvalidArgument& e) {
    // The library names its option field; hsgd-rendezvous names its flag instead.
    EXPECT_NE(std::string(e.what()).find("its limit (max_jobs)"), std::string::npos) << e.what();
  }
  b.set("later", to_bytes("now"));
  EXPECT_EQ(to_string(b.get("later", 5s)), "now");
}

// A job with its own token is opened by that token only (its key derives from it); the
// server-wide token opens the jobs without one.
TEST(RendezvousLimitsTest, JobTokens_IsolateJobs_ServerTokenOpensTheOthers) {
  auto server = start_server({.token = "root", .job_tokens = {{"a", "ta"}, {"b", "tb"}}});
  TcpStore a(client_options(*server, "a", "ta"));
  a.set("secret", to_bytes("of a"));
  EXPECT_THROW(TcpStore(client_options(*server, "a", "tb")), CommError);
  EXPECT_THROW(TcpStore(client_options(*server, "c", "ta")), CommError);
  EXPECT_THROW(TcpStore(client_options(*server, "a", "root")), CommError);
  TcpStore other(client_options(*server, "c", "root"));
  EXPECT_FALSE(other.check({"secret"}));
  other.set("secret", to_bytes("of c"));
  EXPECT_EQ(to_string(a.get("secret", 5s)), "of a");
}

}  // namespace
}  // namespace hsgd::comm
