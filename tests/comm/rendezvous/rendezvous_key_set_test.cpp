// RendezvousServer's shared answers: waits for the same keys share one KeySet, answered once with
// one encoded buffer that every waiter's reply carries (comm/rendezvous/detail/rendezvous_state.h).
// Each waiter must still get its own id, every value in its own key order, its own deadline, and
// the bytes protobuf would have written for its whole Response.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/error.h"
#include "comm/rendezvous/detail/rendezvous_server_session.h"
#include "comm/rendezvous/detail/rendezvous_state.h"
#include "comm/rendezvous/frame.h"
#include "comm/rendezvous/proto/rendezvous.pb.h"
#include "comm/rendezvous/rendezvous_server.h"
#include "comm/rendezvous/tcp_store.h"
#include "tests/comm/rendezvous/rendezvous_test_util.h"

namespace hsgd::comm {
namespace {

using namespace std::chrono_literals;
using testing::client_options;
using testing::eventually;
using testing::RawClient;
using testing::start_plain_server;
using testing::start_server;

std::string request_frame(uint64_t id, proto::Op op, const std::vector<std::string>& keys,
                          int64_t timeout_ms) {
  proto::Request request;
  request.set_id(id);
  request.set_op(op);
  for (const auto& key : keys) request.add_keys(key);
  request.set_timeout_ms(timeout_ms);
  return request.SerializeAsString();
}

// A raw connection of job "job" with one blocking request sent.
std::unique_ptr<RawClient> waiting(const RendezvousServer& server, uint64_t id, proto::Op op,
                                   const std::vector<std::string>& keys,
                                   int64_t timeout_ms = 20'000) {
  auto raw = std::make_unique<RawClient>(server.host(), server.port());
  EXPECT_TRUE(raw->hello("job").accepted());
  raw->send_frame(request_frame(id, op, keys, timeout_ms));
  return raw;
}

std::vector<std::string> key_names(int n, const std::string& prefix = "k") {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) keys.push_back(prefix + std::to_string(i));
  return keys;
}

std::string value_of(const std::string& key) { return "value of " + key; }

// Reads the reply of raw and checks it is OK with id and the values of keys in their order, and
// that its bytes are exactly protobuf's encoding of that Response.
void expect_answer(RawClient& raw, uint64_t id, const std::vector<std::string>& keys,
                   bool values = true) {
  const auto frame = raw.read_frame(20s);
  ASSERT_TRUE(frame.has_value()) << "request " << id << ": no reply";
  proto::Response expected;
  expected.set_id(id);
  if (values) {
    for (const auto& key : keys) expected.add_values(value_of(key));
  }
  proto::Response got;
  ASSERT_TRUE(got.ParseFromString(*frame)) << "request " << id;
  EXPECT_EQ(got.id(), id);
  EXPECT_EQ(got.status(), proto::STATUS_OK) << "request " << id << ": " << got.error();
  ASSERT_EQ(got.values_size(), expected.values_size()) << "request " << id;
  for (int i = 0; i < got.values_size(); ++i) {
    EXPECT_EQ(got.values(i), expected.values(i)) << "request " << id << ", value " << i;
  }
  EXPECT_EQ(*frame, expected.SerializeAsString()) << "request " << id << ": not protobuf's bytes";
}

void set_all(const RendezvousServer& server, const std::vector<std::string>& keys) {
  TcpStore setter(client_options(server));
  for (const auto& key : keys) setter.set(key, to_bytes(value_of(key)));
}

TEST(RendezvousKeySetTest, FrameHead_PlusSharedTail_IsProtobufsFrame) {
  proto::Response whole;
  whole.set_id(300);  // a two-byte varint
  proto::Response tail;
  for (const char* v : {"a", "", "ccc"}) {
    whole.add_values(v);
    tail.add_values(v);
  }
  proto::Response head;
  head.set_id(300);
  const std::string shared = tail.SerializeAsString();
  EXPECT_EQ(encode_frame_head(head, shared.size(), 1024, "test") + shared,
            encode_frame(whole, 1024, "test"));
  EXPECT_THROW(encode_frame_head(head, 2000, 1024, "test"), InvalidArgument);
}

// The waits after the first are matched by the bytes of their keys: what the scan finds in a
// frame protobuf wrote must be what the state encodes for the parsed keys.
TEST(RendezvousKeySetTest, ScanOfAProtobufFrame_FindsTheKeysTheStateEncodes) {
  proto::Request request;
  request.set_id(300);
  request.set_op(proto::OP_MULTI_GET);
  for (const std::string& key : {std::string("rank0"), std::string(), std::string(200, 'k')}) {
    request.add_keys(key);
  }
  request.set_timeout_ms(-1);
  const std::string body = request.SerializeAsString();
  const auto scanned = scan_blocking_request(body);
  ASSERT_TRUE(scanned.has_value());
  EXPECT_EQ(scanned->id, 300u);
  EXPECT_EQ(scanned->op, proto::OP_MULTI_GET);
  EXPECT_EQ(scanned->timeout_ms, -1);
  EXPECT_EQ(std::string(scanned->keys_wire), RendezvousState::encode_keys_wire(request.keys()));

  // Anything else is parsed whole: writes, other fields, keys split by another field, no keys,
  // a truncated frame.
  proto::Request set = request;
  set.set_op(proto::OP_SET);
  EXPECT_FALSE(scan_blocking_request(set.SerializeAsString()).has_value());
  proto::Request with_value = request;
  with_value.add_values("v");
  EXPECT_FALSE(scan_blocking_request(with_value.SerializeAsString()).has_value());
  proto::Request first_key, id_only;
  first_key.add_keys("a");
  id_only.set_id(1);
  const std::string split =
      request.SerializeAsString() + id_only.SerializeAsString() + first_key.SerializeAsString();
  EXPECT_FALSE(scan_blocking_request(split).has_value());
  proto::Request no_keys;
  no_keys.set_op(proto::OP_WAIT);
  EXPECT_FALSE(scan_blocking_request(no_keys.SerializeAsString()).has_value());
  EXPECT_FALSE(scan_blocking_request(body.substr(0, body.size() - 3)).has_value());
}

// Waiters on several connections name the same keys; the keys are written by several threads
// at once. Every waiter gets its own id and every value in order.
TEST(RendezvousKeySetTest, ManyWaitersOfTheSameKeys_EachGetsItsIdAndAllValuesInOrder) {
  auto server = start_plain_server();
  const auto keys = key_names(40);
  std::vector<std::unique_ptr<RawClient>> waiters;
  for (uint64_t id = 1; id <= 24; ++id) {
    waiters.push_back(waiting(*server, id, proto::OP_MULTI_GET, keys));
  }
  ASSERT_TRUE(eventually([&] { return server->num_pending_waits() == 24; }));
  std::vector<std::thread> writers;
  for (int w = 0; w < 4; ++w) {
    writers.emplace_back([&, w] {
      TcpStore store(client_options(*server));
      for (size_t i = w; i < keys.size(); i += 4) store.set(keys[i], to_bytes(value_of(keys[i])));
    });
  }
  for (auto& t : writers) t.join();
  for (uint64_t id = 1; id <= 24; ++id) expect_answer(*waiters[id - 1], id, keys);
  EXPECT_EQ(server->num_pending_waits(), 0u);
}

// Other orders, a wait (no values) and a get of one key are other KeySets: each answered as asked.
TEST(RendezvousKeySetTest, OtherOrderWaitAndGet_EachAnsweredAsAsked) {
  auto server = start_plain_server();
  const auto keys = key_names(5);
  const std::vector<std::string> reversed(keys.rbegin(), keys.rend());
  auto a = waiting(*server, 1, proto::OP_MULTI_GET, keys);
  auto b = waiting(*server, 2, proto::OP_MULTI_GET, reversed);
  auto c = waiting(*server, 3, proto::OP_WAIT, keys);
  auto d = waiting(*server, 4, proto::OP_GET, {keys[2]});
  auto e = waiting(*server, 5, proto::OP_MULTI_GET, {keys[2]});
  auto f = waiting(*server, 6, proto::OP_MULTI_GET, {keys[0], keys[0], keys[1]});
  ASSERT_TRUE(eventually([&] { return server->num_pending_waits() == 6; }));
  set_all(*server, keys);
  expect_answer(*a, 1, keys);
  expect_answer(*b, 2, reversed);
  expect_answer(*c, 3, keys, /*values=*/false);
  expect_answer(*d, 4, {keys[2]});
  expect_answer(*e, 5, {keys[2]});
  expect_answer(*f, 6, {keys[0], keys[0], keys[1]});
}

TEST(RendezvousKeySetTest, OneWaiterTimesOut_TheOthersOfItsKeysAreStillAnswered) {
  auto server = start_plain_server();
  const auto keys = key_names(3);
  auto patient = waiting(*server, 1, proto::OP_MULTI_GET, keys);
  auto hasty = waiting(*server, 2, proto::OP_MULTI_GET, keys, 200);
  TcpStore store(client_options(*server));
  store.set(keys[0], to_bytes(value_of(keys[0])));
  const auto frame = hasty->read_frame(10s);
  ASSERT_TRUE(frame.has_value());
  proto::Response timed_out;
  ASSERT_TRUE(timed_out.ParseFromString(*frame));
  EXPECT_EQ(timed_out.id(), 2u);
  EXPECT_EQ(timed_out.status(), proto::STATUS_TIMEOUT);
  ASSERT_EQ(timed_out.missing_keys_size(), 2);
  EXPECT_EQ(timed_out.missing_keys(0), keys[1]);
  EXPECT_EQ(timed_out.missing_keys(1), keys[2]);
  EXPECT_EQ(server->num_pending_waits(), 1u);
  set_all(*server, keys);
  expect_answer(*patient, 1, keys);
  EXPECT_EQ(server->num_pending_waits(), 0u);
}

TEST(RendezvousKeySetTest, DisconnectedWaiters_LeaveTheKeySet_TheLastOneIsAnswered) {
  auto server = start_plain_server();
  const auto keys = key_names(3);
  std::vector<std::unique_ptr<RawClient>> gone;
  for (uint64_t id = 1; id <= 3; ++id) gone.push_back(waiting(*server, id, proto::OP_WAIT, keys));
  auto stays = waiting(*server, 9, proto::OP_WAIT, keys);
  ASSERT_TRUE(eventually([&] { return server->num_pending_waits() == 4; }));
  // Leaving in another order than they came: the middle one first.
  gone[1]->close();
  gone[0]->close();
  gone[2]->close();
  ASSERT_TRUE(eventually([&] { return server->num_pending_waits() == 1; }));
  set_all(*server, keys);
  expect_answer(*stays, 9, keys, /*values=*/false);
}

// The last answer is reused only while nothing was written: a new value, or a deleted key, is
// seen by the next request.
TEST(RendezvousKeySetTest, AnswerAfterAWriteOrDelete_SeesTheNewState) {
  auto server = start_server();
  const auto keys = key_names(4);
  set_all(*server, keys);
  TcpStore store(client_options(*server));
  EXPECT_EQ(to_string(store.multi_get(keys, 5s)[3]), value_of(keys[3]));
  EXPECT_EQ(to_string(store.multi_get(keys, 5s)[3]), value_of(keys[3]));
  store.set(keys[3], to_bytes("new"));
  EXPECT_EQ(to_string(store.multi_get(keys, 5s)[3]), "new");
  EXPECT_TRUE(store.delete_key(keys[1]));
  EXPECT_THROW(store.multi_get(keys, 200ms), Timeout);
  store.set(keys[1], to_bytes("back"));
  const auto values = store.multi_get(keys, 5s);
  EXPECT_EQ(to_string(values[1]), "back");
  EXPECT_EQ(to_string(values[3]), "new");
}

// A key deleted after it was seen, before the KeySet completed, is waited for again.
TEST(RendezvousKeySetTest, KeyDeletedBeforeTheLastArrives_IsWaitedForAgain) {
  auto server = start_plain_server();
  const auto keys = key_names(2);
  auto raw = waiting(*server, 1, proto::OP_MULTI_GET, keys);
  ASSERT_TRUE(eventually([&] { return server->num_pending_waits() == 1; }));
  TcpStore store(client_options(*server));
  store.set(keys[0], to_bytes(value_of(keys[0])));
  EXPECT_TRUE(store.delete_key(keys[0]));
  store.set(keys[1], to_bytes(value_of(keys[1])));
  EXPECT_FALSE(raw->read_frame(300ms).has_value()) << "answered without " << keys[0];
  store.set(keys[0], to_bytes(value_of(keys[0])));
  expect_answer(*raw, 1, keys);
}

// A job's byte quota counts the keys of a pending KeySet once, however many wait on it; a new
// KeySet is charged its keys.
TEST(RendezvousKeySetTest, JoiningWaiters_AreNotChargedTheKeysAgain) {
  const auto keys = key_names(10, std::string(95, 'x'));      // about 1,000 bytes of keys
  auto server = start_plain_server({.max_job_bytes = 3000});  // a KeySet is charged twice its keys
  std::vector<std::unique_ptr<RawClient>> waiters;
  for (uint64_t id = 1; id <= 5; ++id) {
    waiters.push_back(waiting(*server, id, proto::OP_MULTI_GET, keys));
  }
  ASSERT_TRUE(eventually([&] { return server->num_pending_waits() == 5; }));
  const std::vector<std::string> other(keys.rbegin(), keys.rend());
  auto refused = waiting(*server, 6, proto::OP_MULTI_GET, other);
  const auto frame = refused->read_frame(10s);
  ASSERT_TRUE(frame.has_value());
  proto::Response response;
  ASSERT_TRUE(response.ParseFromString(*frame));
  EXPECT_EQ(response.status(), proto::STATUS_INVALID_ARGUMENT);
  EXPECT_NE(response.error().find("max_job_bytes"), std::string::npos) << response.error();
  waiters.clear();  // their KeySet goes: its bytes come back
  ASSERT_TRUE(eventually([&] { return server->num_pending_waits() == 0; }));
  auto now_fits = waiting(*server, 7, proto::OP_MULTI_GET, other);
  ASSERT_TRUE(eventually([&] { return server->num_pending_waits() == 1; }));
}

}  // namespace
}  // namespace hsgd::comm
