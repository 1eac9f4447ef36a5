// Checkpointer::save and load are collective. A save that the other ranks do not join (the
// habit `if (rank == 0) ckpt.save(step)`) fails within seconds on every rank that waits in a
// collective, names the Checkpointer and the step, and leaves no step directory behind. The groups
// have a 120 s timeout, so an error within 30 s comes from the mismatch check (2 s threshold).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "comm/error.h"
#include "comm/process_group/process_group.h"
#include "framework/checkpoint/checkpointer.h"
#include "models/mlp.h"
#include "tests/support/error_message.h"
#include "tests/support/multiprocess.h"
#include "tests/support/world.h"

namespace hsgd::checkpoint {
namespace {

namespace fs = std::filesystem;
using hsgd::testing::error_message;
using hsgd::testing::run_world;
using hsgd::testing::unique_temp_dir;
using hsgd::testing::WorldOptions;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr double kMuchSoonerSeconds = 30.0;

WorldOptions long_timeout() {
  WorldOptions options;
  options.timeout = std::chrono::seconds(120);
  options.deadline = std::chrono::seconds(100);
  return options;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::unique_ptr<Checkpointer> make_checkpointer(const fs::path& dir,
                                                const std::shared_ptr<comm::ProcessGroup>& pg) {
  auto ckpt = std::make_unique<Checkpointer>(CheckpointOptions{.dir = dir.string()}, pg, RunInfo{});
  ckpt->add_module("model", std::make_shared<models::MLP>(models::MLPOptions{.sizes = {4, 3}}));
  return ckpt;
}

// Training goes on with a gradient allreduce per step; rank 0 alone saves at step 10.
TEST(CollectiveSaveTest, SaveOnRankZeroOnly_FailsWithinSecondsNamingTheStep) {
  const fs::path dir = unique_temp_dir("rank0_save");
  auto result = run_world(3, long_timeout(), [&](int rank, const auto& pg) {
    auto ckpt = make_checkpointer(dir, pg);
    ckpt->save(5);  // every rank: fine
    ckpt->wait();
    std::vector<float> grads(32, 1.0f);
    const auto start = Clock::now();
    const std::string message = error_message<comm::CollectiveMismatch>([&] {
      for (int64_t step = 6; step <= 20; ++step) {
        pg->allreduce(std::span<float>(grads), comm::ReduceOp::kAvg, "DDP bucket 0")->wait();
        if (step == 10 && rank == 0) ckpt->save(step);
      }
    });
    EXPECT_LT(seconds_since(start), kMuchSoonerSeconds) << "rank " << rank;
    if (rank == 0) {
      EXPECT_THAT(message, HasSubstr("Checkpointer::save(step 10) was called on rank 0 only; "
                                     "every rank must call it"));
    }
    // Every rank names the save and the ranks in it.
    EXPECT_THAT(message, HasSubstr("'Checkpointer::save(step 10)' was called on rank 0 only; "
                                   "ranks 1, 2 are in allreduce (32 x float, avg)"))
        << "rank " << rank;
  });
  EXPECT_RANKS_OK(result);
  // Nothing of step 10 was written; step 5 is the newest checkpoint.
  EXPECT_FALSE(fs::exists(dir / "step_10"));
  EXPECT_TRUE(fs::exists(dir / "step_5"));
  fs::remove_all(dir);
}

// The other ranks finished (they shut their group down) when rank 0 saves: rank 0 fails within
// seconds, and so do the others, whose shutdown waits for rank 0.
TEST(CollectiveSaveTest, SaveAfterTheOthersFinished_FailsWithinSeconds) {
  const fs::path dir = unique_temp_dir("late_save");
  auto result = run_world(3, long_timeout(), [&](int rank, const auto& pg) {
    auto ckpt = make_checkpointer(dir, pg);
    const auto start = Clock::now();
    const std::string message = error_message<comm::CollectiveMismatch>([&] {
      if (rank == 0) {
        ckpt->save(3);
      } else {
        pg->shutdown(std::chrono::seconds(90));
      }
    });
    EXPECT_LT(seconds_since(start), kMuchSoonerSeconds) << "rank " << rank;
    if (rank == 0) {
      EXPECT_THAT(message, HasSubstr("Checkpointer::save(step 3) was called on rank 0 only; "
                                     "every rank must call it"));
    }
    EXPECT_THAT(message, HasSubstr("'Checkpointer::save(step 3)' was called on rank 0 only; "
                                   "ranks 1, 2 have left the group"))
        << "rank " << rank;
  });
  EXPECT_RANKS_OK(result);
  EXPECT_FALSE(fs::exists(dir / "step_3"));
  fs::remove_all(dir);
}

// Saves of different steps do not meet either.
TEST(CollectiveSaveTest, DifferentSteps_FailNamingBoth) {
  const fs::path dir = unique_temp_dir("steps_save");
  auto result = run_world(2, long_timeout(), [&](int rank, const auto& pg) {
    auto ckpt = make_checkpointer(dir, pg);
    const std::string message =
        error_message<comm::CollectiveMismatch>([&] { ckpt->save(rank == 0 ? 10 : 11); });
    EXPECT_THAT(message, HasSubstr(rank == 0 ? "Checkpointer::save(step 10) was called on rank 0"
                                             : "Checkpointer::save(step 11) was called on rank 1"));
    EXPECT_THAT(message, HasSubstr("rank 1 is in barrier #0 'Checkpointer::save(step 11)'"));
  });
  EXPECT_RANKS_OK(result);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hsgd::checkpoint
