// HashStore and FileStore against the Store contract (store.h), plus the Gloo adapter.

#include <gtest/gtest.h>

#include <thread>

#include "comm/error.h"
#include "comm/file_store.h"
#include "comm/gloo_store.h"
#include "comm/hash_store.h"
#include "tests/support/multiprocess.h"

namespace hsgd::comm {
namespace {

using namespace std::chrono_literals;

class StoreContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "hash") {
      store_ = std::make_shared<HashStore>();
    } else {
      dir_ = hsgd::testing::unique_temp_dir("store");
      store_ = std::make_shared<FileStore>(dir_);
    }
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::shared_ptr<Store> store_;
  std::filesystem::path dir_;
};

TEST_P(StoreContractTest, SetGetOverwriteDelete) {
  store_->set("a/b c", to_bytes("one"));
  EXPECT_EQ(to_string(store_->get("a/b c", 1s)), "one");
  store_->set("a/b c", Bytes{});  // empty values are values
  EXPECT_TRUE(store_->get("a/b c", 1s).empty());
  EXPECT_TRUE(store_->check({"a/b c"}));
  EXPECT_EQ(store_->num_keys(), 1);
  EXPECT_TRUE(store_->delete_key("a/b c"));
  EXPECT_FALSE(store_->delete_key("a/b c"));
  EXPECT_FALSE(store_->check({"a/b c"}));
  EXPECT_EQ(store_->num_keys(), 0);
}

TEST_P(StoreContractTest, AddCountsFromZero) {
  EXPECT_EQ(store_->add("n", 5), 5);
  EXPECT_EQ(store_->add("n", -7), -2);
  EXPECT_EQ(to_string(store_->get("n", 1s)), "-2");
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
}

TEST_P(StoreContractTest, WaitTimesOutNamingMissingKeys) {
  store_->set("present", to_bytes("1"));
  try {
    store_->wait({"present", "absent"}, 50ms);
    FAIL() << "expected Timeout";
  } catch (const Timeout& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'absent'"), std::string::npos) << message;
    EXPECT_EQ(message.find("'present'"), std::string::npos) << message;
  }
  EXPECT_THROW(store_->get("absent", 20ms), Timeout);
}

TEST_P(StoreContractTest, GetWakesWhenAnotherThreadSets) {
  std::thread setter([&] {
    std::this_thread::sleep_for(20ms);
    store_->set("late", to_bytes("here"));
  });
  EXPECT_EQ(to_string(store_->get("late", 10s)), "here");
  setter.join();
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

TEST_P(StoreContractTest, GlooAdapterPrefixesKeys) {
  auto adapter = as_gloo_store(store_, "pre/", 50ms);
  adapter->set("x", std::vector<char>{'h', 'i'});
  EXPECT_EQ(to_string(store_->get("pre/x", 1s)), "hi");
  EXPECT_EQ(adapter->get("x"), (std::vector<char>{'h', 'i'}));
  EXPECT_THROW(adapter->wait({"missing"}), Timeout);  // Gloo's wait without timeout is bounded
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreContractTest, ::testing::Values("hash", "file"),
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
