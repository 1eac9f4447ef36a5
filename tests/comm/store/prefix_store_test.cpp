// PrefixStore over a TcpStore: keys land under prefix + "/" in the base store, and every
// operation (including the blocking ones) goes through the prefix.

#include "comm/store/prefix_store.h"

#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "comm/error.h"
#include "comm/rendezvous/rendezvous_server.h"
#include "comm/rendezvous/tcp_store.h"
#include "tests/comm/rendezvous/rendezvous_test_util.h"

namespace hsgd::comm {
namespace {

using namespace std::chrono_literals;

class PrefixStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.start();
    base_ = std::make_shared<TcpStore>(
        TcpStoreOptions{.port = server_.port(), .token = "test-token", .connect_timeout = 10s});
  }
  RendezvousServer server_{{.port = 0, .token = "test-token"}};
  std::shared_ptr<TcpStore> base_;
};

TEST_F(PrefixStoreTest, KeysLandUnderPrefixInBase) {
  PrefixStore store("group-3", base_);
  store.set("rank0", to_bytes("a"));
  EXPECT_EQ(to_string(base_->get("group-3/rank0", 5s)), "a");
  EXPECT_FALSE(base_->check({"rank0"}));
  EXPECT_EQ(to_string(store.get("rank0", 5s)), "a");
  EXPECT_EQ(store.add("n", 2), 2);
  EXPECT_EQ(to_string(base_->get("group-3/n", 5s)), "2");
  EXPECT_TRUE(store.compare_set("c", {}, to_bytes("x")).swapped);
  EXPECT_TRUE(base_->check({"group-3/c"}));
  EXPECT_TRUE(store.check({"rank0", "n", "c"}));
  EXPECT_TRUE(store.delete_key("c"));
  EXPECT_FALSE(base_->check({"group-3/c"}));
  store.multi_set({"m1", "m2"}, {to_bytes("1"), to_bytes("2")});
  auto values = base_->multi_get({"group-3/m2", "group-3/m1"}, 5s);
  EXPECT_EQ(to_string(values[0]), "2");
  EXPECT_EQ(to_string(values[1]), "1");
  EXPECT_EQ(to_string(store.multi_get({"m1"}, 5s)[0]), "1");
  EXPECT_EQ(store.num_keys(), base_->num_keys());
}

TEST_F(PrefixStoreTest, TwoPrefixesDoNotCollide_AndNest) {
  PrefixStore a("a", base_);
  auto b = std::make_shared<PrefixStore>("b", base_);
  PrefixStore nested("inner", b);
  a.set("k", to_bytes("A"));
  b->set("k", to_bytes("B"));
  nested.set("k", to_bytes("N"));
  EXPECT_EQ(to_string(a.get("k", 5s)), "A");
  EXPECT_EQ(to_string(b->get("k", 5s)), "B");
  EXPECT_EQ(to_string(base_->get("b/inner/k", 5s)), "N");
}

TEST_F(PrefixStoreTest, WaitThroughPrefix_IsWokenAndTimesOutNamingFullKey) {
  PrefixStore store("pg", base_);
  auto other =
      std::make_shared<TcpStore>(TcpStoreOptions{.port = server_.port(), .token = "test-token"});
  std::thread t([&] { store.wait({"ready"}, 30s); });
  ASSERT_TRUE(testing::eventually([&] { return server_.num_pending_waits() == 1; }));
  other->set("pg/ready", to_bytes("1"));
  t.join();
  try {
    store.get("missing", 100ms);
    FAIL() << "must time out";
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("pg/missing"), std::string::npos) << e.what();
  }
}

TEST(PrefixStoreConstructTest, NullBase_ThrowsInvalidArgument) {
  EXPECT_THROW(PrefixStore("p", nullptr), InvalidArgument);
}

}  // namespace
}  // namespace hsgd::comm
