// Collectives of ProcessGroup across separate processes (one per rank, FileStore rendezvous),
// over world sizes 1..8 and buffer sizes 1, 1000 and 1,000,000. Expected values are computed
// from the inputs in closed form, independently of the implementation.

#include "comm/process_group/process_group.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>
#include <tuple>

#include "comm/error.h"
#include "comm/process_group/detail/gloo_allreduce.h"
#include "comm/store/file_store.h"
#include "comm/store/hash_store.h"
#include "tests/support/multiprocess.h"
#include "tests/support/world.h"

namespace hsgd::comm {
namespace {

using hsgd::testing::run_ranks;
using hsgd::testing::run_world;
using hsgd::testing::unique_temp_dir;
using hsgd::testing::WorldOptions;

// Input of rank r at index i: small integers, so float sums are exact.
template <typename T>
T input(int rank, size_t i) {
  return static_cast<T>((rank + 1) * static_cast<int>(i % 7 + 1) - 3);
}

template <typename T>
void check_allreduce(ProcessGroup& pg, size_t n, ReduceOp op) {
  const int p = pg.size();
  std::vector<T> data(n);
  for (size_t i = 0; i < n; ++i) data[i] = input<T>(pg.rank(), i);
  pg.allreduce(std::span<T>(data), op)->wait();
  for (size_t i = 0; i < n; ++i) {
    T sum = 0, lo = input<T>(0, i), hi = input<T>(0, i);
    for (int r = 0; r < p; ++r) {
      sum += input<T>(r, i);
      lo = std::min(lo, input<T>(r, i));
      hi = std::max(hi, input<T>(r, i));
    }
    T expected = op == ReduceOp::kSum   ? sum
                 : op == ReduceOp::kAvg ? sum / static_cast<T>(p)
                 : op == ReduceOp::kMin ? lo
                                        : hi;
    if (std::abs(data[i] - expected) > std::abs(expected) * T(1e-6)) {
      ADD_FAILURE() << "allreduce " << to_string(op) << " n=" << n << " world=" << p
                    << " rank=" << pg.rank() << ": index " << i << " expected " << expected
                    << " got " << data[i];
      return;
    }
  }
}

void check_broadcast(ProcessGroup& pg, size_t n, int root) {
  std::vector<float> data(n, -1.0f);
  if (pg.rank() == root) {
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<float>(i % 1000) + 0.5f;
  }
  pg.broadcast(std::span<float>(data), root)->wait();
  for (size_t i = 0; i < n; ++i) {
    const float expected = static_cast<float>(i % 1000) + 0.5f;
    if (data[i] != expected) {
      ADD_FAILURE() << "broadcast root " << root << " n=" << n << ": index " << i << " expected "
                    << expected << " got " << data[i];
      return;
    }
  }
}

void check_allgather(ProcessGroup& pg, size_t n) {
  std::vector<float> in(n);
  for (size_t i = 0; i < n; ++i) in[i] = input<float>(pg.rank(), i);
  std::vector<float> out(n * static_cast<size_t>(pg.size()), -99.0f);
  pg.allgather(std::span<const float>(in), std::span<float>(out))->wait();
  for (int r = 0; r < pg.size(); ++r) {
    for (size_t i = 0; i < n; ++i) {
      const float got = out[static_cast<size_t>(r) * n + i];
      if (got != input<float>(r, i)) {
        ADD_FAILURE() << "allgather n=" << n << ": block " << r << " index " << i << " expected "
                      << input<float>(r, i) << " got " << got;
        return;
      }
    }
  }
  std::vector<int64_t> in64{int64_t{1} << 40 | pg.rank(), -pg.rank()};
  std::vector<int64_t> out64(2 * static_cast<size_t>(pg.size()));
  pg.allgather(std::span<const int64_t>(in64), std::span<int64_t>(out64))->wait();
  for (int r = 0; r < pg.size(); ++r) {
    EXPECT_EQ(out64[2 * static_cast<size_t>(r)], int64_t{1} << 40 | r);
    EXPECT_EQ(out64[2 * static_cast<size_t>(r) + 1], -r);
  }
}

// (world size, shared memory on): every collective over Gloo's TCP transport and, for
// allreduce, over shared memory (all ranks of these tests run on one node).
class CollectivesTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(CollectivesTest, AllOpsMatchClosedForm) {
  const auto [world, shm] = GetParam();
  const WorldOptions options{.deadline = std::chrono::seconds(90),
                             .timeout = std::chrono::seconds(30),
                             .shared_memory = shm};
  auto result = run_world(world, options, [&](int rank, const auto& pg) {
    ASSERT_EQ(pg->rank(), rank);
    ASSERT_EQ(pg->size(), world);
    ASSERT_EQ(pg->uses_shared_memory(), shm && world > 1);
    // 1,000,000 elements on every other world size keeps 8 processes on 2 cores fast. Over TCP,
    // 1, 1000 and 100000 take the pinned ring on 2 ranks, halving-doubling on more, and
    // 1,000,000 (4 MB) the ring on the caller's memory; every algorithm forced below.
    std::vector<size_t> sizes{1, 1000, 100000};
    if (world % 2 == 1 || world == 8) sizes.push_back(1000000);
    for (size_t n : sizes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
        check_allreduce<float>(*pg, n, op);
        if (n <= 100000) check_allreduce<double>(*pg, n, op);
      }
      check_broadcast(*pg, n, world - 1);
      check_allgather(*pg, n < 1000000 ? n : 1000);
      pg->barrier()->wait();
    }
    pg->shutdown(std::chrono::seconds(30));
  });
  EXPECT_RANKS_OK(result);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CollectivesTest,
                         ::testing::Combine(::testing::Range(1, 9), ::testing::Bool()),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_shm" : "_tcp");
                         });

// Every algorithm kAuto may choose, forced at every size, incl. non-power-of-two worlds for
// halving-doubling, and repeated calls (cached algorithm objects) with changing inputs.
TEST(ProcessGroupTest, EveryAllreduceAlgorithmAtEverySize) {
  for (int world : {3, 4}) {
    const auto dir = unique_temp_dir("algorithms");
    auto result = run_ranks(world, std::chrono::seconds(60), [&](int rank) {
      auto store = std::make_shared<FileStore>(dir);
      for (auto algorithm : {AllreduceAlgorithm::kHalvingDoubling, AllreduceAlgorithm::kRingChunked,
                             AllreduceAlgorithm::kRing, AllreduceAlgorithm::kPinnedRing,
                             AllreduceAlgorithm::kDirect, AllreduceAlgorithm::kDirectScatter}) {
        auto pg = init_process_group({.rank = rank,
                                      .world_size = world,
                                      .store = store,
                                      .key_prefix = to_string(algorithm) + std::string("/"),
                                      .token = "test-token",
                                      .timeout = std::chrono::seconds(30),
                                      .allreduce_algorithm = algorithm});
        for (size_t n : {size_t{1}, size_t{1000}, size_t{100000}}) {
          for (int repeat = 0; repeat < 2; ++repeat) {
            check_allreduce<float>(*pg, n, repeat == 0 ? ReduceOp::kSum : ReduceOp::kMax);
            check_allreduce<double>(*pg, n, ReduceOp::kAvg);
          }
        }
        pg->barrier()->wait();
      }
    });
    EXPECT_RANKS_OK(result) << "world " << world;
    std::filesystem::remove_all(dir);
  }
}

// kDirect and kDirectScatter sum the ranks' buffers in rank order, so each rank holds exactly
// ((x0 + x1) + x2) + ..., bit for bit, where the inputs make the order matter (sums of values
// of very different magnitude). The calls alternate between its two inboxes and one rank falls
// behind now and then (a faster rank writing into an inbox still being read may show here).
TEST(ProcessGroupTest, DirectAlgorithms_SumInRankOrderOnEveryRank) {
  for (const auto& [world, algorithm] :
       {std::pair{3, AllreduceAlgorithm::kDirect}, std::pair{5, AllreduceAlgorithm::kDirect},
        std::pair{2, AllreduceAlgorithm::kDirectScatter},
        std::pair{3, AllreduceAlgorithm::kDirectScatter},
        std::pair{5, AllreduceAlgorithm::kDirectScatter}}) {
    const auto dir = unique_temp_dir("direct");
    auto result = run_ranks(world, std::chrono::seconds(60), [&](int rank) {
      auto store = std::make_shared<FileStore>(dir);
      auto pg = init_process_group({.rank = rank,
                                    .world_size = world,
                                    .store = store,
                                    .token = "test-token",
                                    .timeout = std::chrono::seconds(30),
                                    .allreduce_algorithm = algorithm});
      // Rank r's value at index i of call c: magnitudes 1e-8 to 1e8, different per rank.
      auto value = [](int r, size_t i, int c) {
        const int k = (r * 7 + static_cast<int>(i) * 3 + c) % 17 - 8;
        return static_cast<float>((r + 1.25 + 0.001 * static_cast<double>(i)) * std::pow(10.0, k));
      };
      for (int call = 0; call < 60; ++call) {
        const size_t n = call % 3 == 0 ? 1 : (call % 3 == 1 ? 257 : 4099);
        if (rank == call % world && call % 4 == 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        std::vector<float> data(n);
        for (size_t i = 0; i < n; ++i) data[i] = value(rank, i, call);
        pg->allreduce(std::span<float>(data))->wait();
        for (size_t i = 0; i < n; ++i) {
          float expected = value(0, i, call);
          for (int r = 1; r < world; ++r) expected += value(r, i, call);
          if (std::memcmp(&data[i], &expected, sizeof(float)) != 0) {
            ADD_FAILURE() << "call " << call << " n=" << n << " world=" << world << " rank=" << rank
                          << ": index " << i << " expected " << expected << " got " << data[i];
            return;
          }
        }
      }
      pg->barrier()->wait();
    });
    EXPECT_RANKS_OK(result) << "world " << world << " " << to_string(algorithm);
    std::filesystem::remove_all(dir);
  }
}

// kAuto over Gloo as process_group.h states it: the direct exchange while each rank sends
// (p - 1) x the buffer <= kDirectAllreduceBytes, the direct scatter up to kSmallAllreduceBytes, the
// ring on the caller's memory above; forced choices stand unless the buffer (for the direct
// exchange: what it holds, 2 p x the buffer) exceeds the cache.
TEST(ProcessGroupTest, AutoAlgorithmFollowsSizeAndRanks) {
  using hsgd::detail::choose_gloo_algorithm;
  const auto direct = AllreduceAlgorithm::kDirect;
  const auto scatter = AllreduceAlgorithm::kDirectScatter;
  const auto ring = AllreduceAlgorithm::kRing;
  const auto auto_ = AllreduceAlgorithm::kAuto;
  const size_t direct_floats = kDirectAllreduceBytes / sizeof(float);  // sent per rank
  const size_t small_floats = kSmallAllreduceBytes / sizeof(float);
  struct Case {
    size_t count;
    int ranks;
    AllreduceAlgorithm expected;
  };
  for (const Case& c : std::vector<Case>{{1, 2, direct},
                                         {direct_floats, 2, direct},
                                         {direct_floats + 1, 2, scatter},
                                         {small_floats, 2, scatter},
                                         {small_floats + 1, 2, ring},
                                         {1, 3, direct},
                                         {direct_floats / 2, 3, direct},
                                         {direct_floats / 2 + 1, 3, scatter},
                                         {4, 4, direct},
                                         {direct_floats / 3, 4, direct},
                                         {direct_floats / 3 + 1, 4, scatter},
                                         {small_floats, 4, scatter},
                                         {small_floats + 1, 4, ring},
                                         {4, 8, direct},
                                         {direct_floats / 7, 8, direct},
                                         {direct_floats / 7 + 1, 8, scatter},
                                         {small_floats, 8, scatter},
                                         {small_floats + 1, 8, ring}}) {
    EXPECT_EQ(choose_gloo_algorithm(auto_, c.count, sizeof(float), c.ranks), c.expected)
        << c.count << " floats on " << c.ranks << " ranks: expected " << to_string(c.expected)
        << ", got " << to_string(choose_gloo_algorithm(auto_, c.count, sizeof(float), c.ranks));
  }
  EXPECT_EQ(choose_gloo_algorithm(AllreduceAlgorithm::kRingChunked, 1, sizeof(float), 8),
            AllreduceAlgorithm::kRingChunked);
  EXPECT_EQ(choose_gloo_algorithm(AllreduceAlgorithm::kPinnedRing, kAllreduceCacheBytes / 4 + 1,
                                  sizeof(float), 2),
            ring);
  // The direct exchange holds 2 p x the buffer, the direct scatter 4 x: forced on 8 ranks, a
  // cache / 16 buffer fits the first, a cache / 4 buffer the second; one float more does not.
  EXPECT_EQ(choose_gloo_algorithm(direct, kAllreduceCacheBytes / 64, sizeof(float), 8), direct);
  EXPECT_EQ(choose_gloo_algorithm(direct, kAllreduceCacheBytes / 64 + 1, sizeof(float), 8), ring);
  const size_t scatter_floats = kAllreduceCacheBytes / 4 / sizeof(float);
  EXPECT_EQ(choose_gloo_algorithm(scatter, scatter_floats, sizeof(float), 8), scatter);
  EXPECT_EQ(choose_gloo_algorithm(scatter, scatter_floats + 1, sizeof(float), 8), ring);
}

TEST(ProcessGroupTest, QueuedCollectivesRunInOrder_WaitOnLastOnly) {
  auto result = run_world(3, [&](int rank, const auto& pg) {
    // Each step doubles the previous result: only FIFO execution gives 3^k * (rank sum).
    std::vector<double> x{static_cast<double>(rank)};
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 5; ++k) works.push_back(pg->allreduce(std::span<double>(x)));
    works.back()->wait();
    for (auto& w : works) EXPECT_TRUE(w->is_completed() && w->is_success());
    EXPECT_EQ(x[0], 3.0 * 81.0);  // (0+1+2) after the first, times 3 for each of four more
  });
  EXPECT_RANKS_OK(result);
}

// Collectives run on the calling thread (RunOn::kCaller) mixed with queued ones that nobody
// waits for one by one: one order on every rank (each allreduce triples the previous sum), and a
// direct call on an idle group returns a completed Work.
TEST(ProcessGroupTest, RunOnCaller_InterleavedWithQueued_KeepsTheOrder) {
  for (const bool shm : {false, true}) {
    auto result = run_world(3, {.shared_memory = shm}, [&](int rank, const auto& pg) {
      std::vector<double> x{static_cast<double>(rank)};
      auto first = pg->allreduce(std::span<double>(x), ReduceOp::kSum, "first", RunOn::kCaller);
      EXPECT_TRUE(first->is_completed()) << "an idle group queued a RunOn::kCaller collective";
      EXPECT_EQ(x[0], 3.0);
      std::vector<std::shared_ptr<Work>> works;
      for (int k = 0; k < 8; ++k) {
        works.push_back(pg->allreduce(std::span<double>(x), ReduceOp::kSum, {},
                                      k % 2 == 0 ? RunOn::kWorker : RunOn::kCaller));
      }
      for (auto& w : works) w->wait(pg->work_timeout());
      EXPECT_EQ(x[0], 3.0 * 6561.0) << "rank " << rank << " shm " << shm;  // 3 * 3^8
      std::vector<float> root(5, rank == 2 ? 7.0f : 0.0f);
      pg->broadcast(std::span<float>(root), 2, "root 2", RunOn::kCaller)->wait();
      EXPECT_EQ(root, std::vector<float>(5, 7.0f)) << "rank " << rank;
      std::vector<int64_t> mine{rank}, all(3, -1);
      pg->allgather(std::span<const int64_t>(mine), std::span<int64_t>(all), {}, RunOn::kCaller)
          ->wait();
      EXPECT_EQ(all, (std::vector<int64_t>{0, 1, 2})) << "rank " << rank;
      pg->barrier("end", RunOn::kCaller)->wait();
      pg->shutdown(std::chrono::seconds(20));
    });
    EXPECT_RANKS_OK(result) << "shm " << shm;
  }
}

// The harness itself: a rank that fails is reported with its reason, and its peers, left
// waiting in a collective, fail within the group's timeout instead of hanging the test.
TEST(RunWorldTest, FailingRankIsNamed_PeersDoNotHang) {
  const auto start = std::chrono::steady_clock::now();
  const WorldOptions options{.deadline = std::chrono::seconds(30),
                             .timeout = std::chrono::seconds(3)};
  auto result = run_world(3, options, [&](int rank, const auto& pg) {
    if (rank == 1) throw std::runtime_error("rank 1 fails on purpose");
    std::vector<float> x(10, 1.0f);
    pg->allreduce(std::span<float>(x))->wait();
  });
  ASSERT_EQ(result.failures.size(), 3u) << result.describe();
  EXPECT_NE(result.failures[1].reason.find("rank 1 fails on purpose"), std::string::npos)
      << result.describe();
  EXPECT_EQ(result.failures[0].reason.find("deadline"), std::string::npos) << result.describe();
  EXPECT_EQ(result.failures[2].reason.find("deadline"), std::string::npos) << result.describe();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(ProcessGroupTest, RanksAsThreadsShareOneHashStore) {
  auto store = std::make_shared<HashStore>();
  auto result = hsgd::testing::run_ranks_in_threads(4, std::chrono::seconds(60), [&](int rank) {
    auto pg =
        init_process_group({.rank = rank, .world_size = 4, .store = store, .token = "test-token"});
    std::vector<float> x(3000, static_cast<float>(rank));
    pg->allreduce(std::span<float>(x), ReduceOp::kMax)->wait();
    for (float v : x) {
      if (v != 3.0f) throw std::runtime_error("max expected 3, got " + std::to_string(v));
    }
  });
  EXPECT_RANKS_OK(result);
}

TEST(ProcessGroupTest, BadArgumentsNameTheValue) {
  auto pg = init_process_group({});
  EXPECT_EQ(pg->size(), 1);
  std::vector<float> x(4), out(3);
  try {
    pg->broadcast(std::span<float>(x), 1);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("root 1"), std::string::npos) << e.what();
  }
  try {
    pg->allgather(std::span<const float>(x), std::span<float>(out));
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("3 elements"), std::string::npos) << e.what();
  }
  EXPECT_THROW(init_process_group({.rank = 2, .world_size = 2, .token = "test-token"}),
               InvalidArgument);
}

TEST(ProcessGroupTest, WorldOfOneIsLocal) {
  auto pg = init_process_group({});
  std::vector<float> x{1.5f, -2.0f};
  pg->allreduce(std::span<float>(x), ReduceOp::kAvg)->wait();
  EXPECT_EQ(x, (std::vector<float>{1.5f, -2.0f}));
  std::vector<float> out(2);
  pg->allgather(std::span<const float>(x), std::span<float>(out))->wait();
  EXPECT_EQ(out, x);
  pg->barrier()->wait();
}

}  // namespace
}  // namespace hsgd::comm

namespace hsgd::comm {
namespace {

// Every rank receives what its left neighbour sent, at 1..4 ranks (2: both neighbours are the
// same rank), repeatedly (one Gloo slot per exchange), and a count that differs between the two
// buffers is refused before anything is sent.
TEST(ProcessGroupTest, RingExchange_ReceivesFromTheLeftNeighbour) {
  for (int world = 1; world <= 4; ++world) {
    auto result = run_world(world, [&](int rank, const auto& pg) {
      for (int64_t round = 0; round < 3; ++round) {
        std::vector<int64_t> send(1000 + round), recv(1000 + round, -1);
        for (size_t i = 0; i < send.size(); ++i) send[i] = rank * 100000 + round * 10000 + i;
        pg->ring_exchange(send, recv)->wait();
        const int left = (rank + world - 1) % world;
        for (size_t i = 0; i < recv.size(); ++i) {
          ASSERT_EQ(recv[i], left * 100000 + round * 10000 + static_cast<int64_t>(i))
              << "world " << world << " rank " << rank << " round " << round << " index " << i;
        }
      }
      std::vector<int64_t> three(3), four(4);
      try {
        pg->ring_exchange(three, four);
        ADD_FAILURE() << "expected InvalidArgument";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("sends 3 elements but receives 4"), std::string::npos)
            << e.what();
      }
    });
    EXPECT_RANKS_OK(result) << "world " << world;
  }
}

// The send buffers of this process's connected TCP sockets (with a FileStore and no shared
// memory, only the group's pairs are).
std::vector<int> tcp_send_buffers() {
  std::vector<int> sizes;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(entry.path().filename().string());
    sockaddr_storage peer{};
    socklen_t length = sizeof(peer);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0) continue;
    if (peer.ss_family != AF_INET && peer.ss_family != AF_INET6) continue;
    int value = 0;
    length = sizeof(value);
    if (::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &value, &length) == 0) sizes.push_back(value);
  }
  return sizes;
}

// A group of world ranks over Gloo's TCP only (shared memory off, plain TCP: the send buffers
// that these tests size are those of Gloo's TCP pairs), meeting through a FileStore in dir.
std::shared_ptr<ProcessGroup> tcp_group(const std::filesystem::path& dir, int rank, int world) {
  return init_process_group({.rank = rank,
                             .world_size = world,
                             .store = std::make_shared<FileStore>(dir),
                             .insecure = true,
                             .timeout = std::chrono::seconds(30),
                             .shared_memory = false});
}

// Gloo fixes a pair's send buffer at twice its first pinned message (a 4-byte allreduce: the
// kernel's minimum of a few KB). The 1 MiB-per-pair exchange that sizes it runs once, before the
// first larger transfer after such a message, and never for a group that only uses unbound
// buffers (a group of node leaders that only runs ring_exchange) or whose pinned messages stay
// small (the metrics on the world's groups): those bytes would cross the slow link for nothing.
TEST(ProcessGroupTest, SendBuffersAreSizedBeforeTheFirstLargeTransferAfterAPinnedOne) {
  const auto dir = unique_temp_dir("sizing");
  auto result = run_ranks(3, std::chrono::seconds(60), [&](int rank) {
    auto pg = tcp_group(dir, rank, 3);
    ASSERT_EQ(hsgd::detail::send_buffer_sizings(), 0) << "connecting sized the send buffers";
    std::vector<int64_t> send(1000, rank), recv(1000);
    pg->ring_exchange(send, recv)->wait();
    check_broadcast(*pg, 1000, 1);
    check_allgather(*pg, 1000);
    pg->barrier()->wait();
    std::vector<float> big(size_t{1} << 22, 1.0f);  // above kSmallAllreduceBytes: the unbound ring
    pg->allreduce(std::span<float>(big), ReduceOp::kSum)->wait();
    EXPECT_EQ(big.front(), 3.0f);
    EXPECT_EQ(hsgd::detail::send_buffer_sizings(), 0) << "unbound collectives sized them";

    check_allreduce<float>(*pg, 1, ReduceOp::kSum);     // the direct exchange: pinned, 4 bytes
    check_allreduce<double>(*pg, 512, ReduceOp::kMax);  // 4 KiB
    EXPECT_EQ(hsgd::detail::send_buffer_sizings(), 0) << "small pinned messages sized them";
    const auto small = tcp_send_buffers();
    ASSERT_EQ(small.size(), 2u) << "one socket per peer";
    for (const int bytes : small) EXPECT_LT(bytes, 64 << 10) << "Gloo left a large buffer";

    check_broadcast(*pg, 100000, 2);  // unbound, 400 KB: sized first
    EXPECT_EQ(hsgd::detail::send_buffer_sizings(), 1);
    std::ifstream wmem_max("/proc/sys/net/core/wmem_max");
    int kernel_bound = 0;
    wmem_max >> kernel_bound;
    for (const int bytes : tcp_send_buffers())
      EXPECT_GE(bytes, 2 * std::min(1 << 20, kernel_bound));
    check_allreduce<float>(*pg, 100000, ReduceOp::kSum);
    pg->allreduce(std::span<float>(big), ReduceOp::kSum)->wait();
    EXPECT_EQ(big.front(), 9.0f);
    EXPECT_EQ(hsgd::detail::send_buffer_sizings(), 1) << "sized more than once";
  });
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

// A group whose first pinned message is large sizes its send buffers before it, as the first
// pinned message of each pair.
TEST(ProcessGroupTest, SendBuffersAreSizedBeforeALargeFirstPinnedAllreduce) {
  const auto dir = unique_temp_dir("sizing-first");
  auto result = run_ranks(3, std::chrono::seconds(60), [&](int rank) {
    auto pg = tcp_group(dir, rank, 3);
    check_allreduce<float>(*pg, 100000, ReduceOp::kSum);
    EXPECT_EQ(hsgd::detail::send_buffer_sizings(), 1);
    check_allreduce<float>(*pg, 1, ReduceOp::kSum);
    EXPECT_EQ(hsgd::detail::send_buffer_sizings(), 1);
  });
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace hsgd::comm
