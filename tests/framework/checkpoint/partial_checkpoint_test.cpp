// framework/checkpoint/: a checkpoint whose manifest is marked partial (what
// scripts/import_torch.py writes: the model only) restores the objects it holds and leaves the
// others as they are; the same files without the mark are refused, naming the missing object.

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "comm/process_group/init.h"
#include "framework/checkpoint/checkpoint_file.h"
#include "framework/checkpoint/checkpointer.h"
#include "framework/nn/functional.h"
#include "models/mlp.h"
#include "optim/sgd.h"
#include "tests/support/multiprocess.h"
#include "tests/support/world.h"

namespace hsgd::checkpoint {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<comm::ProcessGroup> world_of_one() {
  return comm::init_process_group(comm::InitOptions{});
}

std::shared_ptr<models::MLP> mlp(uint64_t seed) {
  return std::make_shared<models::MLP>(models::MLPOptions{.sizes = {6, 5, 3}, .seed = seed});
}

// Writes DIR/step_<step> holding only "model.*" (seed 1's weights) and sets the manifest's
// partial mark to `partial`.
void write_model_only(const fs::path& dir, int64_t step, bool partial) {
  {
    Checkpointer ckpt({.dir = dir.string()}, world_of_one(), {.model = "mlp"});
    ckpt.add_module("model", mlp(1));
    ckpt.save(step);
  }
  const std::string manifest_path = step_dir(dir.string(), step) + "/" + kManifestName;
  proto::Manifest manifest;
  ASSERT_TRUE(manifest.ParseFromString(read_envelope(manifest_path, kManifestKind)));
  manifest.set_partial(partial);
  write_envelope(manifest_path, kManifestKind, manifest.SerializeAsString());
}

// One SGD step with momentum, so that the optimizer has state a load could overwrite.
void train_one_step(models::MLP& model, optim::SGD& sgd) {
  sgd.zero_grad();
  nn::cross_entropy(model.forward(ones({2, 6})), {0, 2}).backward();
  sgd.step();
}

TEST(PartialCheckpointTest, RestoresTheModelAndLeavesTheOptimizerAlone) {
  const fs::path dir = testing::unique_temp_dir("ckpt-partial");
  write_model_only(dir, 0, /*partial=*/true);

  auto model = mlp(2);
  optim::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  train_one_step(*model, sgd);
  const StateDict optimizer_before = sgd.state_dict();
  ASSERT_TRUE(optimizer_before.contains("state.0.momentum_buffer"));

  Checkpointer ckpt({.dir = (dir / "run").string()}, world_of_one(), {.model = "mlp"});
  ckpt.add_module("model", model);
  ckpt.add("optimizer", sgd);
  const std::optional<LoadedCheckpoint> loaded = ckpt.load(step_dir(dir.string(), 0));
  ASSERT_TRUE(loaded.has_value());
  EXPECT_TRUE(loaded->partial);
  EXPECT_EQ(loaded->step, 0);

  const nn::NamedTensors expected = mlp(1)->state_dict(), got = model->state_dict();
  ASSERT_EQ(expected.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].second.to_vector(), expected[i].second.to_vector()) << got[i].first;
  }
  const StateDict optimizer_after = sgd.state_dict();
  EXPECT_EQ(optimizer_after.get_tensor("state.0.momentum_buffer").to_vector(),
            optimizer_before.get_tensor("state.0.momentum_buffer").to_vector());
  // Saving after a partial load works and writes a complete checkpoint.
  ckpt.save(1);
  ckpt.wait();
  EXPECT_EQ(ckpt.complete_steps(), std::vector<int64_t>{1});
}

TEST(PartialCheckpointTest, WithoutTheMarkAMissingObjectIsRefusedByName) {
  const fs::path dir = testing::unique_temp_dir("ckpt-not-partial");
  write_model_only(dir, 0, /*partial=*/false);
  auto model = mlp(2);
  optim::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  Checkpointer ckpt({.dir = (dir / "run").string()}, world_of_one(), {.model = "mlp"});
  ckpt.add_module("model", model);
  ckpt.add("optimizer", sgd);
  try {
    ckpt.load(step_dir(dir.string(), 0));
    FAIL() << "a model-only checkpoint without the partial mark was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("has no state for 'optimizer'"), std::string::npos)
        << e.what();
  }
}

// Written with no hierarchy by one rank: a partial checkpoint starts a hierarchical run of one
// process (the same world size, so the hierarchy was compared before) and of 2 ranks; without
// the mark the same files are refused by their hierarchy.
TEST(PartialCheckpointTest, StartsARunOfAnyHierarchyAndWorldSize) {
  const fs::path dir = testing::unique_temp_dir("ckpt-partial-hierarchy");
  write_model_only(dir / "partial", 0, /*partial=*/true);
  write_model_only(dir / "complete", 0, /*partial=*/false);
  const RunInfo hierarchical{.mode = "hierarchical", .hierarchy = "2:2,8:world", .model = "mlp"};
  {
    auto model = mlp(2);
    Checkpointer ckpt({.dir = (dir / "alone").string()}, world_of_one(), hierarchical);
    ckpt.add_module("model", model);
    const std::optional<LoadedCheckpoint> loaded =
        ckpt.load(step_dir((dir / "partial").string(), 0));
    ASSERT_TRUE(loaded.has_value());
    EXPECT_EQ(model->state_dict()[0].second.to_vector(),
              mlp(1)->state_dict()[0].second.to_vector());
    try {
      ckpt.load(step_dir((dir / "complete").string(), 0));
      FAIL() << "a complete checkpoint of another hierarchy was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("hierarchy (none), this run has 2:2,8:world"),
                std::string::npos)
          << e.what();
    }
  }
  const auto result =
      testing::run_world(2, [&](int, const std::shared_ptr<comm::ProcessGroup>& world) {
        auto model = mlp(2);
        Checkpointer ckpt({.dir = (dir / "two").string()}, world, hierarchical);
        ckpt.add_module("model", model);
        const std::optional<LoadedCheckpoint> loaded =
            ckpt.load(step_dir((dir / "partial").string(), 0));
        ASSERT_TRUE(loaded.has_value());
        EXPECT_TRUE(loaded->resized);
        EXPECT_EQ(model->state_dict()[0].second.to_vector(),
                  mlp(1)->state_dict()[0].second.to_vector());
      });
  EXPECT_RANKS_OK(result);
}

TEST(PartialCheckpointTest, AnObjectItHoldsMustStillMatch) {
  const fs::path dir = testing::unique_temp_dir("ckpt-partial-shape");
  write_model_only(dir, 0, /*partial=*/true);
  auto other = std::make_shared<models::MLP>(models::MLPOptions{.sizes = {6, 4, 3}});
  Checkpointer ckpt({.dir = (dir / "run").string()}, world_of_one(), {.model = "mlp"});
  ckpt.add_module("model", other);
  EXPECT_THROW(ckpt.load(step_dir(dir.string(), 0)), Error);
}

}  // namespace
}  // namespace hsgd::checkpoint
