// framework/checkpoint/: round trips, resume equivalence, fallback on damaged files, keep_last,
// multi-rank agreement, resuming on another world size, and refusals.

#include "framework/checkpoint/checkpointer.h"

// The header an application gets through hsgd.h keeps the checkpoint format's generated code
// (and protobuf) out of it.
#ifdef GOOGLE_PROTOBUF_VERSION
#error "framework/checkpoint/checkpointer.h includes a protobuf header"
#endif

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "comm/process_group/init.h"
#include "framework/data/data_loader.h"
#include "framework/data/synthetic_dataset.h"
#include "framework/nn/functional.h"
#include "framework/tensor/ops.h"
#include "models/mlp.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"
#include "tests/support/multiprocess.h"
#include "tests/support/world.h"

namespace hsgd::checkpoint {
namespace {

namespace fs = std::filesystem;
using testing::unique_temp_dir;

// A complete little training run: model, SGD with momentum, cosine LR, shuffled loader, and a
// generator that perturbs the loss (so its state matters).
struct TrainingRun {
  std::shared_ptr<models::MLP> model;
  std::shared_ptr<optim::SGD> sgd;
  std::unique_ptr<optim::CosineAnnealingLR> scheduler;
  std::unique_ptr<data::DataLoader> loader;
  Generator noise{7};
  int64_t steps = 0;

  explicit TrainingRun(int rank = 0, int world = 1, uint64_t model_seed = 1) {
    model =
        std::make_shared<models::MLP>(models::MLPOptions{.sizes = {16, 12, 4}, .seed = model_seed});
    sgd = std::make_shared<optim::SGD>(model->parameters(),
                                       optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    scheduler = std::make_unique<optim::CosineAnnealingLR>(
        *sgd, optim::CosineAnnealingLROptions{.t_max = 40});
    auto dataset = std::make_shared<data::SyntheticDataset>(data::SyntheticOptions{.size = 96});
    loader = std::make_unique<data::DataLoader>(
        dataset,
        data::DataLoaderOptions{
            .batch_size = 8, .shuffle = true, .seed = 3, .rank = rank, .world_size = world});
  }

  void register_with(Checkpointer& ckpt) {
    ckpt.add_module("model", model);
    ckpt.add("optimizer", sgd);
    ckpt.add("scheduler", *scheduler);
    ckpt.add("loader", *loader);
    ckpt.add_generator("noise", noise);
  }

  // Trains until `until` steps in total, resuming the loader where it is.
  void train_to(int64_t until, Checkpointer* ckpt = nullptr, int64_t every = 0) {
    while (steps < until) {
      loader->set_epoch(loader->epoch());
      for (const data::Batch& batch : *loader) {
        sgd->zero_grad();
        Tensor loss = nn::cross_entropy(model->forward(batch.inputs), batch.targets);
        loss = loss * (1.0f + 0.01f * noise.uniform(0, 1));
        loss.backward();
        sgd->step();
        scheduler->step();
        ++steps;
        if (ckpt != nullptr && every > 0 && steps % every == 0) ckpt->save(steps);
        if (steps == until) return;
      }
      loader->set_epoch(loader->epoch() + 1);
    }
  }
};

std::shared_ptr<comm::ProcessGroup> world_of_one() {
  return comm::init_process_group(comm::InitOptions{});
}

void expect_same_parameters(nn::Module& a, nn::Module& b) {
  const nn::NamedTensors sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    const std::vector<float> va = sa[i].second.to_vector(), vb = sb[i].second.to_vector();
    ASSERT_EQ(va.size(), vb.size()) << sa[i].first;
    for (size_t j = 0; j < va.size(); ++j) {
      ASSERT_EQ(va[j], vb[j]) << sa[i].first << " element " << j;  // bitwise
    }
  }
}

// Flips one byte in the middle of a file.
void flip_byte(const fs::path& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  const auto size = static_cast<std::streamoff>(fs::file_size(file));
  f.seekg(size / 2);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x20);
  f.seekp(size / 2);
  f.write(&c, 1);
}

TEST(CheckpointerTest, ResumeIsBitwiseIdenticalToAnUninterruptedRun_OneProcess) {
  const fs::path dir = unique_temp_dir("ckpt-resume");
  TrainingRun uninterrupted;
  uninterrupted.train_to(30);

  {
    TrainingRun first;
    Checkpointer ckpt({.dir = dir.string()}, world_of_one(), {.model = "mlp"});
    first.register_with(ckpt);
    first.train_to(17, &ckpt, 5);  // checkpoints at 5, 10, 15; "killed" at 17
    ckpt.wait();
  }
  TrainingRun resumed(0, 1, /*model_seed=*/99);  // another initialisation: load must overwrite it
  Checkpointer ckpt({.dir = dir.string()}, world_of_one(), {.model = "mlp"});
  resumed.register_with(ckpt);
  const std::optional<LoadedCheckpoint> loaded = ckpt.load();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->step, 15);
  EXPECT_EQ(loaded->path, (dir / "step_15").string());
  resumed.steps = loaded->step;
  resumed.train_to(30);
  expect_same_parameters(*uninterrupted.model, *resumed.model);
  EXPECT_EQ(resumed.scheduler->last_epoch(), uninterrupted.scheduler->last_epoch());
  EXPECT_DOUBLE_EQ(*resumed.sgd->param_groups()[0].lr, *uninterrupted.sgd->param_groups()[0].lr);
}

TEST(CheckpointerTest, KeepsTheLastKCompleteCheckpoints) {
  const fs::path dir = unique_temp_dir("ckpt-keep");
  TrainingRun run;
  Checkpointer ckpt({.dir = dir.string(), .keep_last = 2}, world_of_one(), {.model = "mlp"});
  run.register_with(ckpt);
  run.train_to(20, &ckpt, 4);
  ckpt.wait();
  EXPECT_EQ(ckpt.complete_steps(), (std::vector<int64_t>{16, 20}));
  EXPECT_FALSE(fs::exists(dir / "step_12"));
  // Debris of an interrupted older write goes too; a newer directory being written stays.
  fs::create_directories(dir / "step_18");
  fs::create_directories(dir / "step_30");
  run.train_to(24, &ckpt, 4);
  ckpt.wait();
  EXPECT_EQ(ckpt.complete_steps(), (std::vector<int64_t>{20, 24}));
  EXPECT_FALSE(fs::exists(dir / "step_18"));
  EXPECT_TRUE(fs::exists(dir / "step_30"));
}

TEST(CheckpointerTest, ApplicationEntriesRoundTrip) {
  const fs::path dir = unique_temp_dir("ckpt-entries");
  TrainingRun run;
  {
    Checkpointer ckpt({.dir = dir.string()}, world_of_one(), {.model = "mlp"});
    run.register_with(ckpt);
    ckpt.set_entry("best_accuracy", "0.875");
    ckpt.set_entry("blob", std::string("\0\1\2", 3));
    ckpt.save(3);
  }
  TrainingRun other;
  Checkpointer ckpt({.dir = dir.string()}, world_of_one(), {.model = "mlp"});
  other.register_with(ckpt);
  EXPECT_FALSE(ckpt.entry("best_accuracy").has_value());
  ASSERT_TRUE(ckpt.load().has_value());
  EXPECT_EQ(ckpt.entry("best_accuracy").value_or(""), "0.875");
  EXPECT_EQ(ckpt.entry("blob").value_or(""), std::string("\0\1\2", 3));
}

// One damaged file of the newest checkpoint: load("auto") falls back to the previous one;
// loading the damaged one by path throws naming the file.
class CheckpointerDamageTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CheckpointerDamageTest, FallsBackToThePreviousCheckpoint) {
  const fs::path dir = unique_temp_dir("ckpt-damage");
  TrainingRun run;
  {
    Checkpointer ckpt({.dir = dir.string()}, world_of_one(), {.model = "mlp"});
    run.register_with(ckpt);
    run.train_to(10, &ckpt, 5);
  }
  const fs::path file = dir / "step_10" / (GetParam() == "manifest" ? "manifest" : "rank_0");
  if (GetParam() == "flipped" || GetParam() == "manifest") flip_byte(file);
  if (GetParam() == "truncated") fs::resize_file(file, fs::file_size(file) / 3);
  if (GetParam() == "missing") fs::remove(file);

  TrainingRun resumed(0, 1, 5);
  Checkpointer ckpt({.dir = dir.string()}, world_of_one(), {.model = "mlp"});
  resumed.register_with(ckpt);
  try {
    ckpt.load((dir / "step_10").string());
    FAIL() << "loading the damaged checkpoint by path did not throw";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
  }
  const std::optional<LoadedCheckpoint> loaded = ckpt.load();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->step, 5);
  TrainingRun reference;
  reference.train_to(5);
  expect_same_parameters(*reference.model, *resumed.model);
}

INSTANTIATE_TEST_SUITE_P(Damage, CheckpointerDamageTest,
                         ::testing::Values("flipped", "truncated", "missing", "manifest"));

TEST(CheckpointerTest, RefusesAnotherModelOrHierarchyNamingBothValues) {
  const fs::path dir = unique_temp_dir("ckpt-refuse");
  {
    TrainingRun run;
    Checkpointer ckpt({.dir = dir.string()}, world_of_one(),
                      {.mode = "hierarchical", .hierarchy = "1:1", .model = "mlp"});
    run.register_with(ckpt);
    ckpt.save(1);
  }
  TrainingRun run;
  Checkpointer other_model({.dir = dir.string()}, world_of_one(), {.model = "resnet20"});
  run.register_with(other_model);
  try {
    other_model.load();
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("model 'mlp', this run builds 'resnet20'"),
              std::string::npos)
        << e.what();
  }
  Checkpointer other_hierarchy({.dir = dir.string()}, world_of_one(),
                               {.mode = "hierarchical", .hierarchy = "2:1", .model = "mlp"});
  TrainingRun run2;
  run2.register_with(other_hierarchy);
  try {
    other_hierarchy.load();
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("hierarchy 1:1, this run has 2:1"), std::string::npos)
        << e.what();
  }
}

TEST(CheckpointerTest, NothingToResumeReturnsNullopt) {
  const fs::path dir = unique_temp_dir("ckpt-empty");
  TrainingRun run;
  Checkpointer ckpt({.dir = dir.string()}, world_of_one(), {.model = "mlp"});
  run.register_with(ckpt);
  EXPECT_FALSE(ckpt.load().has_value());
}

TEST(CheckpointerTest, BadUseIsRefused) {
  const fs::path dir = unique_temp_dir("ckpt-bad");
  TrainingRun run;
  Checkpointer ckpt({.dir = dir.string()}, world_of_one(), {.model = "mlp"});
  run.register_with(ckpt);
  EXPECT_THROW(ckpt.add_module("model", run.model), InvalidArgument);
  EXPECT_THROW(ckpt.add_module("a.b", run.model), InvalidArgument);
  ckpt.save(4);
  EXPECT_THROW(ckpt.save(4), InvalidArgument);
  EXPECT_THROW(Checkpointer({.dir = dir.string(), .keep_last = 0}, world_of_one(), {}),
               InvalidArgument);
  // A directory that cannot be created: named in the error.
  const fs::path file = dir / "a_file";
  std::ofstream(file) << "x";
  try {
    Checkpointer bad({.dir = (file / "sub").string()}, world_of_one(), {});
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find((file / "sub").string()), std::string::npos) << e.what();
  }
}

// A small tmpfs (mounted by the test; needs root, skipped otherwise).
class TmpfsMount {
 public:
  TmpfsMount(const fs::path& dir, const char* options, unsigned long flags) : dir_(dir) {
    fs::create_directories(dir_);
    mounted_ = ::mount("tmpfs", dir_.c_str(), "tmpfs", flags, options) == 0;
    error_ = errno;
  }
  ~TmpfsMount() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  std::string error() const { return std::strerror(error_); }

 private:
  fs::path dir_;
  bool mounted_ = false;
  int error_ = 0;
};

// The step directories under dir ("step_1", ...), complete or not.
std::vector<std::string> step_dirs(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code error;
  for (const auto& e : fs::directory_iterator(dir, error)) {
    if (e.path().filename().string().rfind("step_", 0) == 0) out.push_back(e.path().string());
  }
  return out;
}

// Disk full: the write fails with a kNoSpace error naming the file, the bytes it needs and the
// bytes free; nothing of the checkpoint is left (no empty step_1/); the training state is
// untouched and training goes on; no incomplete checkpoint counts.
TEST(CheckpointerTest, DiskFullIsAClearErrorAndLeavesTrainingAlone) {
  const fs::path dir = unique_temp_dir("ckpt-full") / "mnt";
  TmpfsMount tmpfs(dir, "size=64k", 0);
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here: " << tmpfs.error();
  TrainingRun run;
  TrainingRun twin;  // trained identically, never checkpointed
  Checkpointer ckpt({.dir = (dir / "ckpt").string()}, world_of_one(), {.model = "mlp"});
  run.model = std::make_shared<models::MLP>(models::MLPOptions{.sizes = {64, 1000, 4}});
  twin.model = std::make_shared<models::MLP>(models::MLPOptions{.sizes = {64, 1000, 4}});
  run.sgd = std::make_shared<optim::SGD>(run.model->parameters(), optim::SGDOptions{.lr = 0.1});
  twin.sgd = std::make_shared<optim::SGD>(twin.model->parameters(), optim::SGDOptions{.lr = 0.1});
  run.scheduler.reset();
  twin.scheduler.reset();
  ckpt.add_module("model", run.model);
  ckpt.save(1);  // 64*1000 + 1000*4 floats: 276 KB, more than the 64 KiB of the disk
  try {
    ckpt.wait();
    FAIL() << "writing past a full disk did not throw";
  } catch (const CheckpointError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find((dir / "ckpt" / "step_1").string()), std::string::npos) << what;
    EXPECT_NE(what.find("No space left on device"), std::string::npos) << what;
    EXPECT_EQ(e.kind(), CheckpointError::Kind::kNoSpace) << what;
    // The file holds at least the parameters; the tmpfs has less than its 64 KiB free.
    EXPECT_GE(e.bytes_needed(), (64u * 1000 + 1000 * 4) * sizeof(float)) << what;
    EXPECT_LE(e.bytes_free(), 64u * 1024) << what;
    EXPECT_LT(e.bytes_free(), e.bytes_needed()) << what;
    EXPECT_NE(what.find(hsgd::str_cat("needs ", e.bytes_needed(), " bytes")), std::string::npos)
        << what;
    EXPECT_NE(what.find(hsgd::str_cat("has ", e.bytes_free(), " bytes free")), std::string::npos)
        << what;
  }
  EXPECT_EQ(step_dirs(dir / "ckpt"), std::vector<std::string>{}) << "a half-made checkpoint";
  expect_same_parameters(*twin.model, *run.model);
  EXPECT_TRUE(ckpt.complete_steps().empty());
  EXPECT_FALSE(ckpt.load().has_value());
}

TEST(CheckpointerTest, ReadOnlyDirectoryIsNamedAtConstruction) {
  const fs::path dir = unique_temp_dir("ckpt-ro") / "mnt";
  TmpfsMount tmpfs(dir, "size=64k", MS_RDONLY);
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here: " << tmpfs.error();
  for (const fs::path& target : {dir, dir / "sub"}) {
    try {
      Checkpointer ckpt({.dir = target.string()}, world_of_one(), {});
      ADD_FAILURE() << "no error for " << target;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(target.string()), std::string::npos) << e.what();
    }
  }
}

// ---- several ranks (forked processes) ----

// A disk full for every rank: each rank's save fails with kNoSpace (rank 0's after the other
// reports are in), and no step directory is left.
TEST(CheckpointerMultiRankTest, DiskFullFailsEveryRankAndLeavesNoStepDirectory) {
  const fs::path dir = unique_temp_dir("ckpt-full-ranks") / "mnt";
  TmpfsMount tmpfs(dir, "size=64k", 0);
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here: " << tmpfs.error();
  constexpr int kWorld = 2;
  auto result =
      testing::run_world(kWorld, [&](int rank, const std::shared_ptr<comm::ProcessGroup>& pg) {
        (void)rank;
        auto model = std::make_shared<models::MLP>(models::MLPOptions{.sizes = {64, 1000, 4}});
        Checkpointer ckpt({.dir = (dir / "ckpt").string()}, pg, {.model = "mlp"});
        ckpt.add_module("model", model);
        ckpt.save(1);
        try {
          ckpt.wait();
          ADD_FAILURE() << "writing past a full disk did not throw";
        } catch (const CheckpointError& e) {
          EXPECT_EQ(e.kind(), CheckpointError::Kind::kNoSpace) << e.what();
          EXPECT_LT(e.bytes_free(), e.bytes_needed()) << e.what();
        }
      });
  ASSERT_RANKS_OK(result);
  EXPECT_EQ(step_dirs(dir / "ckpt"), std::vector<std::string>{}) << "a half-made checkpoint";
}

// One rank cannot write its file (its temporary name is taken by a directory): that rank's error
// names its file, rank 0's names the rank and says the checkpoint was removed, and the files the
// other ranks wrote are gone with it (no half-made step_2/; step_1 stays the newest complete).
TEST(CheckpointerMultiRankTest, OneRankFailing_RemovesTheWholeStepDirectory) {
  const fs::path dir = unique_temp_dir("ckpt-one-fails");
  constexpr int kWorld = 3;
  auto result = testing::run_world(kWorld, [&](int rank,
                                               const std::shared_ptr<comm::ProcessGroup>& pg) {
    auto model = std::make_shared<models::MLP>(models::MLPOptions{.sizes = {16, 12, 4}});
    Checkpointer ckpt({.dir = dir.string()}, pg, {.model = "mlp"});
    ckpt.add_module("model", model);
    ckpt.save(1);
    ckpt.wait();
    if (rank == 1) {
      fs::create_directories(dir / "step_2" / (".rank_1.tmp." + std::to_string(::getpid())) / "x");
    }
    pg->barrier()->wait();
    ckpt.save(2);
    try {
      ckpt.wait();
      EXPECT_EQ(rank, 2) << "rank " << rank << ": no error";
    } catch (const CheckpointError& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.kind(), CheckpointError::Kind::kOther) << what;
      if (rank == 0) {
        EXPECT_NE(what.find("is incomplete (no manifest written, the directory removed): "
                            "rank 1: error"),
                  std::string::npos)
            << what;
      } else {
        EXPECT_EQ(rank, 1) << what;
        EXPECT_NE(what.find("rank_1"), std::string::npos) << what;
      }
    }
  });
  ASSERT_RANKS_OK(result);
  EXPECT_EQ(step_dirs(dir), std::vector<std::string>{(dir / "step_1").string()});
}

// Each rank trains its own replica (different data shard); a checkpoint restores each rank's own
// state; a corrupt file of one rank makes every rank fall back to the previous checkpoint.
TEST(CheckpointerMultiRankTest, EveryRankRestoresItsOwnStateAndAllFallBackTogether) {
  const fs::path dir = unique_temp_dir("ckpt-ranks");
  constexpr int kWorld = 3;
  auto result =
      testing::run_world(kWorld, [&](int rank, const std::shared_ptr<comm::ProcessGroup>& pg) {
        TrainingRun run(rank, kWorld);
        Checkpointer ckpt({.dir = dir.string()}, pg, {.model = "mlp"});
        run.register_with(ckpt);
        run.train_to(12, &ckpt, 6);
        ckpt.wait();
      });
  ASSERT_RANKS_OK(result);
  flip_byte(dir / "step_12" / "rank_1");

  result = testing::run_world(kWorld, [&](int rank, const std::shared_ptr<comm::ProcessGroup>& pg) {
    TrainingRun resumed(rank, kWorld, 42);
    Checkpointer ckpt({.dir = dir.string()}, pg, {.model = "mlp"});
    resumed.register_with(ckpt);
    const std::optional<LoadedCheckpoint> loaded = ckpt.load();
    ASSERT_TRUE(loaded.has_value());
    EXPECT_EQ(loaded->step, 6);
    TrainingRun reference(rank, kWorld);
    reference.train_to(6);
    expect_same_parameters(*reference.model, *resumed.model);
  });
  EXPECT_RANKS_OK(result);
}

// Written at world size 4 while the replicas were equal (same model, different momentum), then
// resumed on 2 ranks: parameters as saved, momentum the average of the 4, loader continuing at
// the global number of samples seen. Without replicas_equal the same resume is refused.
TEST(CheckpointerMultiRankTest, ResumesOnAnotherWorldSizeOnlyWhenReplicasWereEqual) {
  const fs::path dir = unique_temp_dir("ckpt-resize");
  auto result = testing::run_world(4, [&](int rank, const std::shared_ptr<comm::ProcessGroup>& pg) {
    TrainingRun run(rank, 4);
    Checkpointer ckpt({.dir = dir.string()}, pg, {.model = "mlp"});
    run.register_with(ckpt);
    run.train_to(2);  // different shards: different momentum buffers
    // Equal replicas: every rank takes rank-independent parameters.
    TrainingRun common;
    run.model->load_state_dict(common.model->state_dict());
    ckpt.save(2, {.replicas_equal = true});
    ckpt.save(3);  // not equal: must not resume on 2 ranks
    ckpt.wait();
  });
  ASSERT_RANKS_OK(result);

  result = testing::run_world(2, [&](int rank, const std::shared_ptr<comm::ProcessGroup>& pg) {
    TrainingRun resumed(rank, 2, 77);
    Checkpointer ckpt({.dir = dir.string()}, pg, {.model = "mlp"});
    resumed.register_with(ckpt);
    try {
      ckpt.load((dir / "step_3").string());
      ADD_FAILURE() << "resuming a checkpoint of unequal replicas on 2 ranks did not throw";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("world size 4, this run has 2"), std::string::npos)
          << e.what();
    }
    const std::optional<LoadedCheckpoint> loaded = ckpt.load((dir / "step_2").string());
    ASSERT_TRUE(loaded.has_value());
    EXPECT_TRUE(loaded->resized);
    TrainingRun common;
    expect_same_parameters(*common.model, *resumed.model);
    // The mean of the four ranks' momentum buffers after their 2 steps.
    const Tensor got = resumed.sgd->momentum_buffer(0);
    std::vector<double> expected(static_cast<size_t>(got.numel()), 0.0);
    for (int r = 0; r < 4; ++r) {
      TrainingRun original(r, 4);
      original.train_to(2);
      const std::vector<float> m = original.sgd->momentum_buffer(0).to_vector();
      for (size_t i = 0; i < m.size(); ++i) expected[i] += m[i] / 4.0;
    }
    const std::vector<float> g = got.to_vector();
    for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], expected[i], 1e-6) << "element " << i;
    // 2 batches of 8 on each of 4 ranks = 64 samples: the 2 ranks split the other 32 of the
    // epoch, 2 batches of 8 each.
    EXPECT_EQ(resumed.loader->offset(), 64);
    EXPECT_EQ(resumed.loader->position(), 0);
    EXPECT_EQ(resumed.loader->num_batches(), 2);
  });
  EXPECT_RANKS_OK(result);
}

}  // namespace
}  // namespace hsgd::checkpoint
