// TcpStore while its rendezvous server is away and after it was started again at the same
// address: what a client wrote is re-published to the new server (values, its share of
// counters, compare_set wins; not what it deleted), also by a client that does not use the
// store meanwhile; a blocking operation waits for the server; inside NoServerWait an operation
// throws ServerUnavailable at once and has no effect; past the reconnect bound the error says
// since when the server is unreachable, what was tried and what to do.

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "comm/error.h"
#include "comm/rendezvous/rendezvous_server.h"
#include "comm/rendezvous/tcp_store.h"
#include "comm/store/store_outage.h"
#include "tests/comm/rendezvous/rendezvous_test_util.h"

namespace hsgd::comm {
namespace {

using namespace std::chrono_literals;
using testing::eventually;

class TcpStoreOutageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<RendezvousServer>(
        RendezvousServerOptions{.port = 0, .token = "test-token"});
    server_->start();
    port_ = server_->port();
  }

  std::unique_ptr<TcpStore> connect(Duration reconnect_timeout = 30s) const {
    return std::make_unique<TcpStore>(TcpStoreOptions{.port = port_,
                                                      .job_id = "job",
                                                      .token = "test-token",
                                                      .connect_timeout = 10s,
                                                      .timeout = 20s,
                                                      .reconnect_timeout = reconnect_timeout});
  }

  // kill: the server and every key it held are gone; then a new one on the same port.
  void stop_server() { server_->stop(); }
  void start_server() {
    server_ = std::make_unique<RendezvousServer>(
        RendezvousServerOptions{.port = port_, .token = "test-token"});
    server_->start();
  }

  std::unique_ptr<RendezvousServer> server_;
  int port_ = 0;
};

// The clients do nothing after the restart: their background threads re-publish.
TEST_F(TcpStoreOutageTest, Restart_IdleClientsRepublishValuesCountersAndWins) {
  auto a = connect();
  auto b = connect();
  a->set("member/0", to_bytes("node-a"));
  b->set("member/1", to_bytes("node-b"));
  EXPECT_EQ(a->add("arrivals", 1), 1);
  EXPECT_EQ(b->add("arrivals", 1), 2);
  EXPECT_EQ(a->add("arrivals", 5), 7);
  EXPECT_TRUE(b->compare_set("failed", {}, to_bytes("b's record")).swapped);
  EXPECT_FALSE(a->compare_set("failed", {}, to_bytes("a's record")).swapped);
  a->set("deleted", to_bytes("x"));
  EXPECT_TRUE(a->delete_key("deleted"));

  stop_server();
  std::this_thread::sleep_for(500ms);  // both notice the loss and retry meanwhile
  start_server();

  auto reader = connect();
  const auto members = reader->multi_get({"member/0", "member/1"}, 10s);
  EXPECT_EQ(to_string(members[0]), "node-a");
  EXPECT_EQ(to_string(members[1]), "node-b");
  EXPECT_TRUE(eventually([&] { return reader->add("arrivals", 0) == 7; }))
      << "the counter must be the sum of both clients' deltas, got " << reader->add("arrivals", 0);
  EXPECT_EQ(to_string(reader->get("failed", 10s)), "b's record") << "only the winner re-publishes";
  EXPECT_FALSE(reader->check({"deleted"})) << "a deleted key must not come back";
}

// A get() waiting when the server goes away waits for the new one and is answered there.
TEST_F(TcpStoreOutageTest, BlockingGetDuringOutage_IsAnsweredByTheNewServer) {
  auto waiter = connect();
  std::string got, error;
  std::thread t([&] {
    try {
      got = to_string(waiter->get("late", 30s));
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  ASSERT_TRUE(eventually([&] { return server_->num_pending_waits() == 1; }));
  stop_server();
  std::this_thread::sleep_for(1s);
  start_server();
  auto setter = connect();
  setter->set("late", to_bytes("v"));
  t.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(got, "v");
}

// The bound counts from the start of each outage: two short ones, together longer than the
// bound, are both ridden out, and the second re-publishes what was written after the first.
TEST_F(TcpStoreOutageTest, TwoShortOutages_EachWithinTheBound) {
  auto store = connect(/*reconnect_timeout=*/3s);
  store->set("first", to_bytes("1"));
  for (int outage = 0; outage < 2; ++outage) {
    stop_server();
    std::this_thread::sleep_for(2s);
    start_server();
    EXPECT_EQ(to_string(store->get("first", 10s)), "1") << "outage " << outage;
    store->set("after/" + std::to_string(outage), to_bytes("x"));
  }
  auto reader = connect();
  EXPECT_TRUE(reader->check({"first", "after/0", "after/1"}));
}

// A get() with a short timeout waits for the server no longer than that timeout.
TEST_F(TcpStoreOutageTest, BlockingGetDuringOutage_KeepsItsOwnTimeout) {
  auto store = connect(/*reconnect_timeout=*/60s);
  store->set("k", to_bytes("1"));
  stop_server();
  const auto start = std::chrono::steady_clock::now();
  try {
    store->get("missing", 1s);
    FAIL() << "get must time out";
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("unreachable since"), std::string::npos) << e.what();
  }
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 1s);
  EXPECT_LT(took, 10s);
}

TEST_F(TcpStoreOutageTest, NoServerWait_ThrowsServerUnavailableAtOnce_WithoutEffect) {
  auto store = connect();
  store->set("k", to_bytes("1"));
  stop_server();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) {
    const NoServerWait no_wait;
    try {
      store->set("during", to_bytes("x"));
      FAIL() << "set must not succeed without a server";
    } catch (const ServerUnavailable& e) {
      EXPECT_EQ(e.outage().endpoint, "127.0.0.1:" + std::to_string(port_));
      EXPECT_GE(e.outage().attempts, 1);
      EXPECT_NE(std::string(e.what()).find("unreachable since"), std::string::npos) << e.what();
    }
  }
  // Five calls made at most a few one-second attempts (none is due most of the time).
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  start_server();
  store->set("after", to_bytes("2"));
  EXPECT_FALSE(store->check({"during"}));
  EXPECT_TRUE(store->check({"k", "after"}));
}

// ServerWait inside NoServerWait: the write waits for the server and lands once it is back
// (as hsgd-run records that its node left while its monitor does not wait).
TEST_F(TcpStoreOutageTest, ServerWaitInsideNoServerWait_WaitsForTheServerAndWrites) {
  auto store = connect();
  store->set("k", to_bytes("1"));
  stop_server();
  const NoServerWait no_wait;
  EXPECT_THROW(store->set("skipped", to_bytes("x")), ServerUnavailable);
  std::thread restart([&] {
    std::this_thread::sleep_for(1s);
    start_server();
  });
  {
    const ServerWait wait;
    EXPECT_FALSE(NoServerWait::active());
    store->set("recorded", to_bytes("2"));  // waits for the restarted server
  }
  restart.join();
  EXPECT_TRUE(NoServerWait::active()) << "ServerWait must restore the enclosing scope";
  EXPECT_TRUE(store->check({"recorded"}));
  EXPECT_FALSE(store->check({"skipped"}));
}

TEST_F(TcpStoreOutageTest, OutageLongerThanTheBound_SaysSinceWhenWhatWasTriedAndWhatToDo) {
  auto store = connect(/*reconnect_timeout=*/1500ms);
  store->set("k", to_bytes("1"));
  stop_server();
  const auto start = std::chrono::steady_clock::now();
  std::string what;
  try {
    store->get("k", 30s);
    FAIL() << "get must fail once the server was away for longer than the bound";
  } catch (const ServerUnavailable& e) {
    FAIL() << "past the bound the error is final, not ServerUnavailable: " << e.what();
  } catch (const CommError& e) {
    what = e.what();
  }
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 1500ms) << what;
  EXPECT_LT(took, 10s) << what;
  const std::string endpoint = "127.0.0.1:" + std::to_string(port_);
  for (const std::string& part :
       {"the rendezvous server at " + endpoint + " is unreachable since ", std::string(" UTC ("),
        std::string("TcpStoreOptions::reconnect_timeout 1.5 s"),
        std::string("connection attempts with backoff"), std::string("Connection refused"),
        "Start the rendezvous server again at " + endpoint, std::string("Or raise")}) {
    EXPECT_NE(what.find(part), std::string::npos) << "missing '" << part << "' in: " << what;
  }
  // And it stays final: the next operation does not wait again.
  const auto again = std::chrono::steady_clock::now();
  EXPECT_THROW(store->set("k", to_bytes("2")), CommError);
  EXPECT_LT(std::chrono::steady_clock::now() - again, 3s);
}

}  // namespace
}  // namespace hsgd::comm
