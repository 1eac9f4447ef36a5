// TcpStore::set_owned: a key that lives as long as the client that set it. The server deletes
// it once none of the client's connections has been open for the key's linger (the process
// ended), keeps it while the linger runs, gives it up for good when another write takes the key
// over, and a restarted server gets it back as an owned key. A connection that names no owner
// cannot own keys.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>

#include "comm/error.h"
#include "comm/rendezvous/rendezvous_server.h"
#include "comm/rendezvous/tcp_store.h"
#include "comm/store/prefix_store.h"
#include "tests/comm/rendezvous/rendezvous_test_util.h"

namespace hsgd::comm {
namespace {

using namespace std::chrono_literals;
using testing::eventually;

class TcpStoreOwnedTest : public ::testing::Test {
 protected:
  void SetUp() override { start_server(); }

  std::unique_ptr<TcpStore> connect() const {
    return std::make_unique<TcpStore>(TcpStoreOptions{.port = port_,
                                                      .job_id = "job",
                                                      .token = "test-token",
                                                      .connect_timeout = 10s,
                                                      .timeout = 20s,
                                                      .reconnect_timeout = 30s});
  }

  void start_server() {
    server_ = std::make_unique<RendezvousServer>(
        RendezvousServerOptions{.port = port_, .token = "test-token"});
    server_->start();
    port_ = server_->port();
  }

  std::unique_ptr<RendezvousServer> server_;
  int port_ = 0;
};

TEST_F(TcpStoreOwnedTest, OwnedKey_IsDeletedAfterItsClientClosed_OrdinaryKeysStay) {
  auto reader = connect();
  auto owner = connect();
  owner->set_owned("alive/a", to_bytes("1"), 100ms);
  owner->set("record/a", to_bytes("host-a"));
  EXPECT_EQ(to_string(reader->get("alive/a", 5s)), "1");

  owner.reset();  // closes every connection of that client
  EXPECT_TRUE(eventually([&] { return !reader->check({"alive/a"}); }))
      << "the owned key must go once its client's connections closed";
  EXPECT_EQ(to_string(reader->get("record/a", 5s)), "host-a");
}

TEST_F(TcpStoreOwnedTest, OwnedKey_StaysWhileItsClientIsConnected_AndDuringTheLinger) {
  auto reader = connect();
  auto owner = connect();
  auto lingering = connect();
  owner->set_owned("alive/a", to_bytes("1"), 100ms);
  lingering->set_owned("alive/b", to_bytes("1"), 600s);
  std::this_thread::sleep_for(500ms);  // several lingers of alive/a
  EXPECT_TRUE(reader->check({"alive/a"})) << "a connected owner keeps its key";

  lingering.reset();
  owner.reset();
  ASSERT_TRUE(eventually([&] { return !reader->check({"alive/a"}); }));
  EXPECT_TRUE(reader->check({"alive/b"})) << "its linger of 600 s has not passed";
}

TEST_F(TcpStoreOwnedTest, AnotherWrite_TakesTheKeyOver_AndItStays) {
  auto reader = connect();
  auto owner = connect();
  owner->set_owned("taken", to_bytes("owned"), 100ms);
  owner->set_owned("control", to_bytes("owned"), 100ms);
  reader->set("taken", to_bytes("plain"));

  owner.reset();
  ASSERT_TRUE(eventually([&] { return !reader->check({"control"}); }))
      << "the owner's other key shows that its keys expired";
  EXPECT_EQ(to_string(reader->get("taken", 5s)), "plain");
}

TEST_F(TcpStoreOwnedTest, ThroughAPrefixStore_TheKeyIsOwnedUnderItsFullName) {
  auto reader = connect();
  auto prefixed = std::make_unique<PrefixStore>("run", std::shared_ptr<TcpStore>(connect()));
  prefixed->set_owned("alive", to_bytes("1"), 100ms);
  EXPECT_TRUE(reader->check({"run/alive"}));
  prefixed.reset();  // and with it the only TcpStore
  EXPECT_TRUE(eventually([&] { return !reader->check({"run/alive"}); }));
}

TEST_F(TcpStoreOwnedTest, RestartedServer_GetsTheKeyBackOwned) {
  auto owner = connect();
  owner->set_owned("alive/a", to_bytes("1"), 100ms);
  owner->set("record/a", to_bytes("host-a"));
  server_->stop();
  std::this_thread::sleep_for(300ms);
  start_server();

  auto reader = connect();
  ASSERT_TRUE(eventually([&] {
    return reader->check({"alive/a", "record/a"});
  })) << "the client re-publishes both keys to the new server";
  owner.reset();
  EXPECT_TRUE(eventually([&] { return !reader->check({"alive/a"}); }))
      << "re-published as an owned key, it goes with its client";
  EXPECT_TRUE(reader->check({"record/a"}));
}

// Raw frames need a plain server: the rule is the session's, the same under TLS.
TEST_F(TcpStoreOwnedTest, AConnectionWithoutOwner_CannotOwnKeys) {
  server_ =
      std::make_unique<RendezvousServer>(RendezvousServerOptions{.port = 0, .insecure = true});
  server_->start();
  port_ = server_->port();
  testing::RawClient raw("127.0.0.1", port_);
  ASSERT_TRUE(raw.hello("job").accepted());
  proto::Request request;
  request.set_id(1);
  request.set_op(proto::OP_SET_OWNED);
  request.add_keys("alive/x");
  request.add_values("1");
  request.set_linger_ms(100);
  raw.send_frame(request.SerializeAsString());
  const auto frame = raw.read_frame();
  ASSERT_TRUE(frame.has_value());
  proto::Response response;
  ASSERT_TRUE(response.ParseFromString(*frame));
  EXPECT_EQ(response.status(), proto::STATUS_INVALID_ARGUMENT);
  EXPECT_NE(response.error().find("needs an owner"), std::string::npos) << response.error();
  TcpStore reader({.port = port_, .job_id = "job", .insecure = true, .connect_timeout = 10s});
  EXPECT_FALSE(reader.check({"alive/x"}));
}

}  // namespace
}  // namespace hsgd::comm
