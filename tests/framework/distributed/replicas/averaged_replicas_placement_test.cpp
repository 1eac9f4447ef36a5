// AveragedReplicas is collective and named after the place it is constructed at: a guard built
// inside `if (rank == 0)` fails at that construction within seconds, naming its place, instead
// of meeting the other ranks' later guard (and failing at an unrelated line). The group has a
// 120 s timeout, so an error within 30 s comes from the mismatch check (2 s threshold).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "comm/error.h"
#include "framework/distributed/averaged_replicas.h"
#include "framework/nn/nn.h"
#include "tests/support/error_message.h"
#include "tests/support/world.h"

namespace hsgd::distributed {
namespace {

using hsgd::testing::error_message;
using hsgd::testing::run_world;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

TEST(AveragedReplicasPlacement, GuardOnRankZeroOnly_FailsAtItsConstruction) {
  hsgd::testing::WorldOptions options;
  options.timeout = std::chrono::seconds(120);
  options.deadline = std::chrono::seconds(100);
  auto result = run_world(3, options, [&](int rank, const auto& pg) {
    Generator gen(7);
    auto model = std::make_shared<nn::Linear>(4, 3, true, gen);
    const auto start = Clock::now();
    const int rank0_line = __LINE__ + 4;  // the line of the guard inside the if
    const int common_line = __LINE__ + 6;
    const std::string message = error_message<comm::CollectiveMismatch>([&] {
      if (rank == 0) {
        AveragedReplicas evaluate_on_rank0(pg, model);
      }
      // ... the other ranks train on; every rank averages before saving:
      { AveragedReplicas before_saving(pg, model); }
    });
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 30.0);
    const std::string rank0_place =
        "averaged_replicas_placement_test.cpp:" + std::to_string(rank0_line);
    const std::string common_place =
        "averaged_replicas_placement_test.cpp:" + std::to_string(common_line);
    EXPECT_THAT(message, HasSubstr("barrier #0 'AveragedReplicas at " + rank0_place +
                                   "' was called on rank 0 only; ranks 1, 2 are in barrier #0 "
                                   "'AveragedReplicas at " +
                                   common_place + "'"))
        << "rank " << rank;
    if (rank == 0) {
      EXPECT_THAT(message, HasSubstr("AveragedReplicas constructed at " + rank0_place +
                                     " on rank 0 only; every rank must construct it at the same "
                                     "place"));
    }
  });
  EXPECT_RANKS_OK(result);
}

}  // namespace
}  // namespace hsgd::distributed
