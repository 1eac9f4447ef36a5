// store_barrier (comm/store/store_barrier.h): returns only once every rank arrived, and on timeout
// names exactly the ranks that did not (with their global ranks when given).

#include "comm/store/store_barrier.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "comm/error.h"
#include "comm/store/file_store.h"
#include "comm/store/hash_store.h"
#include "tests/support/error_message.h"
#include "tests/support/multiprocess.h"

namespace hsgd::comm {
namespace {

using namespace std::chrono_literals;
using hsgd::testing::error_message;
using ::testing::HasSubstr;

TEST(StoreBarrierTest, ReturnsOnlyOnceEveryRankArrived_Threads) {
  for (int size : {1, 2, 3, 5}) {
    auto store = std::make_shared<HashStore>();
    std::atomic<int> arrived{0};
    auto result = hsgd::testing::run_ranks_in_threads(size, 30s, [&](int rank) {
      // The last rank comes late: nobody may leave before it.
      if (rank == size - 1) std::this_thread::sleep_for(100ms);
      arrived.fetch_add(1);
      store_barrier(*store, "b/", rank, size, 10s,
                    {.value = to_bytes("from " + std::to_string(rank))});
      EXPECT_EQ(arrived.load(), size) << "rank " << rank << " left before every rank arrived";
    });
    EXPECT_RANKS_OK(result);
    // Each rank wrote its value under its own key.
    const auto values = store->multi_get(store_barrier_keys("b/", size), 1s);
    ASSERT_EQ(values.size(), static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(to_string(values[static_cast<size_t>(r)]), "from " + std::to_string(r))
          << "size " << size << ", rank " << r;
    }
  }
}

TEST(StoreBarrierTest, Timeout_NamesTheMissingRanks) {
  HashStore store;
  store.set("p/2", to_bytes("1"));  // rank 2 arrived; 1 and 3 did not
  const std::string message =
      error_message<Timeout>([&] { store_barrier(store, "p/", /*rank=*/0, /*size=*/4, 200ms); });
  EXPECT_THAT(message, HasSubstr("store barrier 'p/' (rank 0 of 4): ranks [1, 3] did not arrive "
                                 "within 200 ms"));
  EXPECT_EQ(store_barrier_missing(store, "p/", 4), (std::vector<int>{1, 3}));
}

TEST(StoreBarrierTest, Timeout_NamesGlobalRanksAndTheCaller) {
  HashStore store;
  const std::vector<int> global = {4, 7, 9};
  store.set("g/1", to_bytes("1"));
  const std::string message = error_message<Timeout>([&] {
    store_barrier(store, "g/", 1, 3, 100ms,
                  {.what = "ProcessGroup 'world/g0' (rank 1 of 3)", .global_ranks = global});
  });
  EXPECT_THAT(message, HasSubstr("ProcessGroup 'world/g0' (rank 1 of 3): ranks [0, 2] (global "
                                 "[4, 9]) did not arrive within 100 ms"));
}

TEST(StoreBarrierTest, MissingProcess_IsNamedByTheOthers) {
  const auto dir = hsgd::testing::unique_temp_dir("store_barrier");
  auto result = hsgd::testing::run_ranks(4, 30s, [&](int rank) {
    if (rank == 1) return;  // never arrives
    FileStore store(dir);
    const std::string message =
        error_message<Timeout>([&] { store_barrier(store, "x/", rank, 4, 500ms); });
    EXPECT_THAT(message, HasSubstr("ranks [1] did not arrive")) << "rank " << rank;
  });
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

TEST(StoreBarrierTest, InvalidArguments_NameTheValue) {
  HashStore store;
  EXPECT_THAT(error_message([&] { store_barrier(store, "q/", 4, 4, 1s); }),
              HasSubstr("rank 4 must be in [0, 4)"));
  EXPECT_THAT(error_message([&] { store_barrier(store, "q/", -1, 2, 1s); }),
              HasSubstr("rank -1 must be in [0, 2)"));
  const std::vector<int> two = {0, 1};
  EXPECT_THAT(error_message([&] { store_barrier(store, "q/", 0, 3, 1s, {.global_ranks = two}); }),
              HasSubstr("2 global ranks given for 3 ranks"));
  EXPECT_EQ(store.num_keys(), 0) << "a rejected call must not write its key";
}

}  // namespace
}  // namespace hsgd::comm
