// The data plane that init_process_group chooses: TLS keyed by the job token (the default), plain
// TCP only when asked for (InitOptions::insecure, with a warning), and an error naming both ways
// out when a group of several ranks has neither. hsgd's allreduce algorithms give the same bits
// over either transport.

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <span>

#include "comm/error.h"
#include "comm/process_group/init.h"
#include "comm/process_group/process_group.h"
#include "comm/store/file_store.h"
#include "comm/store/hash_store.h"
#include "tests/support/log_capture.h"
#include "tests/support/multiprocess.h"

namespace {

using namespace std::chrono_literals;
using hsgd::InvalidArgument;
using hsgd::comm::AllreduceAlgorithm;
using hsgd::comm::FileStore;
using hsgd::comm::HashStore;
using hsgd::comm::init_process_group;
using hsgd::testing::run_ranks;
using hsgd::testing::unique_temp_dir;

// Values whose float sum depends on the order of the additions, so equal bits mean equal order.
std::vector<float> input(int rank, size_t n) {
  std::mt19937 random(static_cast<uint32_t>(rank * 7919 + n));
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = value(random);
  return x;
}

TEST(DataPlaneTest, EveryAllreduceAlgorithmGivesTheSameBitsOverTlsAndPlainTcp) {
  for (int world : {2, 3, 5}) {
    const auto dir = unique_temp_dir("data_plane");
    auto result = run_ranks(world, 180s, [&](int rank) {
      auto store = std::make_shared<FileStore>(dir);
      for (auto algorithm : {AllreduceAlgorithm::kHalvingDoubling, AllreduceAlgorithm::kRingChunked,
                             AllreduceAlgorithm::kRing, AllreduceAlgorithm::kPinnedRing,
                             AllreduceAlgorithm::kDirect, AllreduceAlgorithm::kDirectScatter}) {
        const std::string name = to_string(algorithm);
        auto tls = init_process_group({.rank = rank,
                                       .world_size = world,
                                       .store = store,
                                       .key_prefix = name + "/tls/",
                                       .token = "data-plane-test-token",
                                       .timeout = 30s,
                                       .allreduce_algorithm = algorithm,
                                       .shared_memory = false});
        auto plain = init_process_group({.rank = rank,
                                         .world_size = world,
                                         .store = store,
                                         .key_prefix = name + "/plain/",
                                         .insecure = true,
                                         .timeout = 30s,
                                         .allreduce_algorithm = algorithm,
                                         .shared_memory = false});
        for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{(1 << 20) + 3}}) {
          std::vector<float> over_tls = input(rank, n);
          std::vector<float> over_plain = over_tls;
          tls->allreduce(std::span<float>(over_tls))->wait();
          plain->allreduce(std::span<float>(over_plain))->wait();
          for (size_t i = 0; i < n; ++i) {
            ASSERT_EQ(std::memcmp(&over_tls[i], &over_plain[i], sizeof(float)), 0)
                << name << ", " << n << " floats, rank " << rank << ", index " << i << ": tls "
                << over_tls[i] << ", plain " << over_plain[i];
          }
        }
        tls->barrier()->wait();
        plain->barrier()->wait();
      }
    });
    EXPECT_RANKS_OK(result) << "world " << world;
    std::filesystem::remove_all(dir);
  }
}

TEST(DataPlaneTest, SeveralRanksWithNeitherTokenNorInsecureAreRefused) {
  try {
    init_process_group({.rank = 0, .world_size = 2, .store = std::make_shared<HashStore>()});
    ADD_FAILURE() << "a group of 2 ranks without a token was created";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("InitOptions::token (HSGD_RDZV_TOKEN)"), std::string::npos) << what;
    EXPECT_NE(what.find("InitOptions::insecure (HSGD_INSECURE=1)"), std::string::npos) << what;
  }
}

TEST(DataPlaneTest, InsecureSaysSoAtStart) {
  const auto dir = unique_temp_dir("data_plane_insecure");
  auto result = run_ranks(2, 60s, [&](int rank) {
    hsgd::testing::LogCapture log;
    auto world = init_process_group({.rank = rank,
                                     .world_size = 2,
                                     .store = std::make_shared<FileStore>(dir),
                                     .insecure = true,
                                     .timeout = 30s});
    world->barrier()->wait();
    const bool warned = log.text().find("unencrypted and unauthenticated") != std::string::npos;
    EXPECT_EQ(warned, rank == 0) << log.text();
  });
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

}  // namespace
