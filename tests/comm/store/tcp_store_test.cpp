// TcpStore against an embedded RendezvousServer, beyond the Store contract that store_test.cpp
// runs for every store: push-based waits woken across connections by set/add/compare_set/
// multi_set, timeouts naming host:port, the connection staying usable after a timeout, connect
// backoff, reconnect after a server restart, limits.

#include "comm/rendezvous/tcp_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/error.h"
#include "comm/rendezvous/frame.h"
#include "comm/rendezvous/rendezvous_server.h"
#include "tests/comm/rendezvous/rendezvous_test_util.h"

namespace hsgd::comm {
namespace {

using namespace std::chrono_literals;
using testing::eventually;

class TcpStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<RendezvousServer>(
        RendezvousServerOptions{.port = 0, .token = "test-token"});
    server_->start();
  }

  TcpStoreOptions options(std::string job = "job") const {
    return {.host = "127.0.0.1",
            .port = server_->port(),
            .job_id = std::move(job),
            .token = "test-token",
            .connect_timeout = 10s,
            .timeout = 20s};
  }

  std::unique_ptr<TcpStore> connect(std::string job = "job") const {
    return std::make_unique<TcpStore>(options(std::move(job)));
  }

  std::string endpoint() const { return "127.0.0.1:" + std::to_string(server_->port()); }

  // Blocks until the server holds `n` pending waits, so that a test's set() really wakes a
  // waiter instead of racing ahead of it.
  void await_waiters(size_t n) const {
    ASSERT_TRUE(eventually([&] { return server_->num_pending_waits() == n; }))
        << "pending waits: " << server_->num_pending_waits() << ", expected " << n;
  }

  std::unique_ptr<RendezvousServer> server_;
};

TEST_F(TcpStoreTest, GetBlocksUntilAnotherClientSets) {
  auto waiter = connect();
  auto setter = connect();
  std::string got;
  std::thread t([&] { got = to_string(waiter->get("late", 30s)); });
  await_waiters(1);
  setter->set("late", to_bytes("arrived"));
  t.join();
  EXPECT_EQ(got, "arrived");
}

TEST_F(TcpStoreTest, WaitIsWokenBySetAndAdd) {
  auto waiter = connect();
  auto writer = connect();
  std::atomic<bool> done = false;
  std::thread t([&] {
    waiter->wait({"by-set", "by-add", "by-set"}, 30s);  // a duplicate key counts once
    done = true;
  });
  await_waiters(1);
  writer->set("by-set", to_bytes("x"));
  EXPECT_EQ(server_->num_pending_waits(), 1u) << "one of two keys must not complete the wait";
  EXPECT_FALSE(done.load());
  EXPECT_EQ(writer->add("by-add", 3), 3);
  t.join();
  EXPECT_TRUE(done.load());
}

TEST_F(TcpStoreTest, WaitIsWokenByCompareSetAndMultiSet) {
  auto waiter = connect();
  auto writer = connect();
  std::thread t([&] { waiter->wait({"cas", "m1", "m2"}, 30s); });
  await_waiters(1);
  EXPECT_TRUE(writer->compare_set("cas", {}, to_bytes("new")).swapped);
  writer->multi_set({"m1", "m2"}, {to_bytes("1"), to_bytes("2")});
  t.join();
  EXPECT_EQ(server_->num_pending_waits(), 0u);
}

TEST_F(TcpStoreTest, WaitTimeout_ThrowsTimeoutNamingMissingKeysAndEndpoint) {
  auto store = connect();
  store->set("present", to_bytes("1"));
  try {
    store->wait({"present", "absent"}, 200ms);
    FAIL() << "wait on a missing key must time out";
  } catch (const Timeout& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(endpoint()), std::string::npos) << what;
    EXPECT_NE(what.find("wait"), std::string::npos) << what;
    EXPECT_NE(what.find("missing: ['absent']"), std::string::npos) << what;
  }
  EXPECT_EQ(server_->num_pending_waits(), 0u);
  // The connection is still usable after a timeout.
  EXPECT_EQ(to_string(store->get("present", 5s)), "1");
}

TEST_F(TcpStoreTest, GetTimeout_ThrowsTimeoutNamingKeyAndEndpoint) {
  auto store = connect();
  try {
    store->get("nobody-sets-this", 150ms);
    FAIL() << "get on a missing key must time out";
  } catch (const Timeout& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("get(['nobody-sets-this'])"), std::string::npos) << what;
    EXPECT_NE(what.find(endpoint()), std::string::npos) << what;
  }
  store->set("k", to_bytes("v"));
  EXPECT_EQ(to_string(store->get("k", 5s)), "v");
}

TEST_F(TcpStoreTest, Add_IsAtomicAcrossClients) {
  constexpr int kThreads = 8;
  constexpr int kAdds = 50;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      auto store = connect();
      for (int j = 0; j < kAdds; ++j) store->add("counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  auto store = connect();
  EXPECT_EQ(store->add("counter", 0), kThreads * kAdds);
}

// Not yet part of the contract: HashStore and FileStore do not check the addition for overflow.
TEST_F(TcpStoreTest, AddOverflow_ThrowsInvalidArgumentAndKeepsValue) {
  auto store = connect();
  store->set("big", to_bytes(std::to_string(INT64_MAX)));
  EXPECT_THROW(store->add("big", 1), InvalidArgument);
  EXPECT_EQ(to_string(store->get("big", 5s)), std::to_string(INT64_MAX));
}

TEST_F(TcpStoreTest, MultiGetBlocksUntilAllKeysExist) {
  auto reader = connect();
  auto writer = connect();
  std::vector<Bytes> got;
  std::thread t([&] { got = reader->multi_get({"p", "q"}, 30s); });
  await_waiters(1);
  writer->set("q", to_bytes("Q"));
  writer->set("p", to_bytes("P"));
  t.join();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(to_string(got[0]), "P");
  EXPECT_EQ(to_string(got[1]), "Q");
}

TEST_F(TcpStoreTest, WaitForDeletedKey_WaitsAgain) {
  auto reader = connect();
  auto writer = connect();
  writer->set("a", to_bytes("1"));
  std::vector<Bytes> got;
  std::thread t([&] { got = reader->multi_get({"a", "b"}, 30s); });
  await_waiters(1);
  writer->delete_key("a");
  writer->set("b", to_bytes("2"));
  // "a" vanished while the reader waited: it must keep waiting rather than answer without it.
  EXPECT_EQ(server_->num_pending_waits(), 1u);
  writer->set("a", to_bytes("3"));
  t.join();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(to_string(got[0]), "3");
  EXPECT_EQ(to_string(got[1]), "2");
}

TEST_F(TcpStoreTest, BlockingGetDoesNotDelaySetFromAnotherThreadOfSameStore) {
  auto store = connect();
  std::string got;
  std::string error;
  std::thread t([&] {
    try {
      got = to_string(store->get("from-same-store", 60s));
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  await_waiters(1);
  store->set("from-same-store", to_bytes("v"));
  t.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(got, "v");
}

TEST_F(TcpStoreTest, PingAndServerVersion) {
  auto store = connect();
  EXPECT_TRUE(store->ping());
  EXPECT_EQ(store->server_version(), kProtocolVersion);
  EXPECT_EQ(store->endpoint(), endpoint());
}

TEST_F(TcpStoreTest, KeyOverServerLimit_IsRejectedLocally) {
  auto store = connect();
  const std::string long_key(5000, 'k');
  try {
    store->set(long_key, to_bytes("v"));
    FAIL() << "a key over the server's limit must be rejected";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("5000 bytes"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(store->ping());
}

TEST_F(TcpStoreTest, ValueOverFrameLimit_IsRejectedLocally) {
  RendezvousServer small({.port = 0, .token = "test-token", .max_frame_bytes = 4096});
  small.start();
  TcpStore store({.port = small.port(), .token = "test-token", .connect_timeout = 10s});
  EXPECT_THROW(store.set("big", Bytes(10000, 1)), InvalidArgument);
  store.set("small", Bytes(100, 1));
  EXPECT_EQ(store.get("small", 5s).size(), 100u);
}

TEST_F(TcpStoreTest, ServerStopWhileWaiting_ThrowsCommError) {
  auto opts = options();
  opts.connect_timeout = 300ms;  // bounds the reconnect attempt of the final ping
  auto store = std::make_unique<TcpStore>(opts);
  std::string error;
  std::thread t([&] {
    try {
      store->get("never", 60s);
    } catch (const CommError& e) {
      error = e.what();
    }
  });
  await_waiters(1);
  server_->stop();
  t.join();
  EXPECT_NE(error.find("closed the connection"), std::string::npos) << error;
  EXPECT_NE(error.find("never"), std::string::npos) << error;
  EXPECT_FALSE(store->ping());
}

TEST_F(TcpStoreTest, ReconnectsAfterServerRestart) {
  auto store = connect();
  store->set("before", to_bytes("1"));
  const int port = server_->port();
  server_->stop();
  {
    const NoServerWait no_wait;
    EXPECT_THROW(store->set("during", to_bytes("x")), ServerUnavailable);
  }
  server_ = std::make_unique<RendezvousServer>(
      RendezvousServerOptions{.port = port, .token = "test-token"});
  server_->start();
  store->set("after", to_bytes("2"));  // reconnects transparently
  EXPECT_EQ(to_string(store->get("after", 5s)), "2");
  EXPECT_EQ(to_string(store->get("before", 5s)), "1") << "re-published to the new server";
  EXPECT_FALSE(store->check({"during"})) << "a write that threw ServerUnavailable did not happen";
}

TEST(TcpStoreConnectTest, NoServer_ThrowsTimeoutNamingEndpoint) {
  // Find a port nobody listens on: bind one, then stop the server.
  int port = 0;
  {
    RendezvousServer probe({.port = 0, .token = "test-token"});
    probe.start();
    port = probe.port();
  }
  try {
    TcpStore store({.port = port, .token = "test-token", .connect_timeout = 300ms});
    FAIL() << "connecting to a closed port must time out";
  } catch (const Timeout& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << what;
    EXPECT_NE(what.find("attempts"), std::string::npos) << what;
  }
}

TEST(TcpStoreConnectTest, RetriesUntilServerStarts) {
  int port = 0;
  {
    RendezvousServer probe({.port = 0, .token = "test-token"});
    probe.start();
    port = probe.port();
  }
  std::unique_ptr<TcpStore> store;
  std::string error;
  std::thread client([&] {
    try {
      store = std::make_unique<TcpStore>(
          TcpStoreOptions{.port = port, .token = "test-token", .connect_timeout = 30s});
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(200ms);  // let the client fail a few attempts first
  RendezvousServer server({.port = port, .token = "test-token"});
  server.start();
  client.join();
  ASSERT_EQ(error, "");
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->ping());
}

TEST(TcpStoreConnectTest, RejectsBadOptions) {
  EXPECT_THROW(TcpStore({.port = 0}), InvalidArgument);
  EXPECT_THROW(TcpStore({.port = 1234, .timeout = 0ms}), InvalidArgument);
}

}  // namespace
}  // namespace hsgd::comm
