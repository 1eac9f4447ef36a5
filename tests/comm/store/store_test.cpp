// The Store contract (store.h), run against every store: HashStore, FileStore, TcpStore against
// an in-process rendezvous server, and PrefixStore (over a TcpStore, as process groups use it);
// plus the Gloo adapter. What only one store does (TCP waits woken across connections,
// reconnects, limits; prefixes landing in the base) is in that store's own suite.

#include <gtest/gtest.h>

#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "comm/error.h"
#include "comm/rendezvous/rendezvous_server.h"
#include "comm/rendezvous/tcp_store.h"
#include "comm/store/file_store.h"
#include "comm/store/gloo_store.h"
#include "comm/store/hash_store.h"
#include "comm/store/prefix_store.h"
#include "tests/support/multiprocess.h"

namespace hsgd::comm {
namespace {

using namespace std::chrono_literals;

class StoreContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string& kind = GetParam();
    if (kind == "hash") {
      store_ = std::make_shared<HashStore>();
    } else if (kind == "file") {
      dir_ = hsgd::testing::unique_temp_dir("store");
      store_ = std::make_shared<FileStore>(dir_);
    } else {
      server_ = std::make_unique<RendezvousServer>(
          RendezvousServerOptions{.port = 0, .token = "test-token"});
      server_->start();
      auto tcp = std::make_shared<TcpStore>(TcpStoreOptions{
          .port = server_->port(), .token = "test-token", .connect_timeout = 10s, .timeout = 20s});
      if (kind == "tcp") {
        store_ = tcp;
      } else {
        ASSERT_EQ(kind, "prefix");
        store_ = std::make_shared<PrefixStore>("group-7", tcp);
      }
    }
  }
  void TearDown() override {
    store_.reset();  // before the server it talks to
    server_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::unique_ptr<RendezvousServer> server_;
  std::shared_ptr<Store> store_;
  std::filesystem::path dir_;
};

TEST_P(StoreContractTest, SetGetOverwriteDelete) {
  store_->set("a/b c", to_bytes("one"));
  EXPECT_EQ(to_string(store_->get("a/b c", 1s)), "one");
  const Bytes binary = {0, 1, 2, 255, 0, 7};  // values are bytes, not text
  store_->set("a/b c", binary);
  EXPECT_EQ(store_->get("a/b c", 1s), binary);
  store_->set("a/b c", Bytes{});  // empty values are values
  EXPECT_TRUE(store_->get("a/b c", 1s).empty());
  EXPECT_TRUE(store_->check({"a/b c"}));
  EXPECT_EQ(store_->num_keys(), 1);
  EXPECT_TRUE(store_->delete_key("a/b c"));
  EXPECT_FALSE(store_->delete_key("a/b c"));
  EXPECT_FALSE(store_->check({"a/b c"}));
  EXPECT_EQ(store_->num_keys(), 0);
}

TEST_P(StoreContractTest, CheckNeedsEveryKey_NumKeysCounts) {
  EXPECT_TRUE(store_->check({}));
  store_->set("a", to_bytes("1"));
  store_->set("b", to_bytes("2"));
  EXPECT_TRUE(store_->check({"a", "b"}));
  EXPECT_FALSE(store_->check({"a", "c"}));
  EXPECT_EQ(store_->num_keys(), 2);
}

TEST_P(StoreContractTest, AddCountsFromZero) {
  EXPECT_EQ(store_->add("n", 5), 5);
  EXPECT_EQ(store_->add("n", -7), -2);
  EXPECT_EQ(to_string(store_->get("n", 1s)), "-2");  // decimal text, like torch's stores
  store_->set("text", to_bytes("abc"));
  try {
    store_->add("text", 1);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'abc'"), std::string::npos) << e.what();
  }
}

TEST_P(StoreContractTest, CompareSet) {
  auto r = store_->compare_set("k", Bytes{}, to_bytes("x"));  // missing matches empty
  EXPECT_TRUE(r.swapped);
  EXPECT_EQ(to_string(r.current), "x");
  r = store_->compare_set("k", to_bytes("y"), to_bytes("z"));
  EXPECT_FALSE(r.swapped);
  EXPECT_EQ(to_string(r.current), "x");
  r = store_->compare_set("k", to_bytes("x"), to_bytes("z"));
  EXPECT_TRUE(r.swapped);
  EXPECT_EQ(to_string(store_->get("k", 1s)), "z");
  // Missing key, non-empty expected: no swap, nothing stored.
  r = store_->compare_set("absent", to_bytes("x"), to_bytes("y"));
  EXPECT_FALSE(r.swapped);
  EXPECT_TRUE(r.current.empty());
  EXPECT_FALSE(store_->check({"absent"}));
}

// The keys in the message are those still missing: some bracketed key list names 'absent'
// without 'present' (a store may also quote the keys of the whole call, as TcpStore does).
TEST_P(StoreContractTest, WaitTimesOutNamingMissingKeys) {
  store_->set("present", to_bytes("1"));
  try {
    store_->wait({"present", "absent"}, 50ms);
    FAIL() << "expected Timeout";
  } catch (const Timeout& e) {
    const std::string message = e.what();
    const std::regex list(R"(\[[^\]]*\])");
    bool names_only_missing = false;
    for (auto it = std::sregex_iterator(message.begin(), message.end(), list);
         it != std::sregex_iterator(); ++it) {
      const std::string keys = it->str();
      if (keys.find("absent'") != std::string::npos && keys.find("present'") == std::string::npos)
        names_only_missing = true;
    }
    EXPECT_TRUE(names_only_missing) << message;
  }
  EXPECT_THROW(store_->get("absent", 20ms), Timeout);
}

TEST_P(StoreContractTest, ZeroTimeout_AnswersAtOnce) {
  EXPECT_THROW(store_->wait({"missing"}, 0ms), Timeout);
  store_->set("there", to_bytes("1"));
  EXPECT_NO_THROW(store_->wait({"there"}, 0ms));
  EXPECT_EQ(to_string(store_->get("there", 0ms)), "1");
}

TEST_P(StoreContractTest, GetWakesWhenAnotherThreadSets) {
  std::thread setter([&] {
    std::this_thread::sleep_for(20ms);
    store_->set("late", to_bytes("here"));
  });
  EXPECT_EQ(to_string(store_->get("late", 10s)), "here");
  setter.join();
}

TEST_P(StoreContractTest, MultiSetAndMultiGet_KeepKeyOrder) {
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  for (int i = 0; i < 20; ++i) {
    keys.push_back(hsgd::str_cat("k", i));
    values.push_back(to_bytes(hsgd::str_cat("v", i * 7)));
  }
  store_->multi_set(keys, values);
  const std::vector<std::string> reversed(keys.rbegin(), keys.rend());
  const std::vector<Bytes> got = store_->multi_get(reversed, 1s);
  ASSERT_EQ(got.size(), keys.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i], values[keys.size() - 1 - i]) << "index " << i;
  }
  EXPECT_THROW(store_->multi_get({"k0", "missing"}, 20ms), Timeout);
  EXPECT_THROW(store_->multi_set({"x", "y"}, {to_bytes("1")}), InvalidArgument);
}

TEST_P(StoreContractTest, ConcurrentAddsAreNotLost) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) store_->add("counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(store_->add("counter", 0), 200);
}

TEST_P(StoreContractTest, OneStoreSharedByThreads) {
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int j = 0; j < 20; ++j) {
        const std::string key = hsgd::str_cat("t", i, "-", j);
        store_->set(key, to_bytes(key));
        EXPECT_EQ(to_string(store_->get(key, 5s)), key);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(store_->num_keys(), 4 * 20);
}

TEST_P(StoreContractTest, GlooAdapterPrefixesKeys) {
  auto adapter = as_gloo_store(store_, "pre/", 50ms);
  adapter->set("x", std::vector<char>{'h', 'i'});
  EXPECT_EQ(to_string(store_->get("pre/x", 1s)), "hi");
  EXPECT_EQ(adapter->get("x"), (std::vector<char>{'h', 'i'}));
  EXPECT_THROW(adapter->wait({"missing"}), Timeout);  // Gloo's wait without timeout is bounded
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreContractTest,
                         ::testing::Values("hash", "file", "tcp", "prefix"),
                         [](const auto& info) { return info.param; });

TEST(FileStoreTest, ConcurrentAddsFromProcessesAreNotLost) {
  const auto dir = hsgd::testing::unique_temp_dir("file_store_procs");
  auto result = hsgd::testing::run_ranks(4, 30s, [&](int) {
    FileStore store(dir);
    for (int i = 0; i < 25; ++i) store.add("counter", 1);
  });
  EXPECT_RANKS_OK(result);
  EXPECT_EQ(FileStore(dir).add("counter", 0), 100);
  std::filesystem::remove_all(dir);
}

TEST(MultiprocessTest, ReportsWhichRankFailedAndWhy) {
  auto result = hsgd::testing::run_ranks(3, 30s, [](int rank) {
    if (rank == 1) throw std::runtime_error("boom on purpose");
  });
  ASSERT_EQ(result.failures.size(), 1u) << result.describe();
  EXPECT_EQ(result.failures[0].rank, 1);
  EXPECT_NE(result.failures[0].reason.find("boom on purpose"), std::string::npos);
}

TEST(MultiprocessTest, KillsRanksThatOutliveTheDeadline) {
  auto result =
      hsgd::testing::run_ranks(2, hsgd::testing::RunOptions{.timeout = 300ms}, [](int rank) {
        if (rank == 0) std::this_thread::sleep_for(60s);
      });
  ASSERT_EQ(result.failures.size(), 1u) << result.describe();
  EXPECT_EQ(result.failures[0].rank, 0);
  EXPECT_NE(result.failures[0].reason.find("deadline"), std::string::npos);
}

}  // namespace
}  // namespace hsgd::comm
