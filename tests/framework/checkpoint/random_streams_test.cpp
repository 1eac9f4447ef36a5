// framework/checkpoint/: the random streams a model owns (nn::Dropout's masks, registered with
// Module::register_generator) are part of its checkpoint, so that a run killed and resumed draws
// the masks an uninterrupted run draws and ends bitwise equal to it, on one rank (killed with
// SIGKILL), with a tree of unseeded dropout layers, and on several ranks with different streams; a
// checkpoint without a generator's state is refused unless it is partial; and the manifest records
// the launcher's ranks per node.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group/init.h"
#include "framework/checkpoint/checkpoint_file.h"
#include "framework/checkpoint/checkpointer.h"
#include "framework/data/data_loader.h"
#include "framework/data/synthetic_dataset.h"
#include "framework/nn/activation.h"
#include "framework/nn/dropout.h"
#include "framework/nn/functional.h"
#include "framework/nn/linear.h"
#include "framework/nn/sequential.h"
#include "optim/sgd.h"
#include "tests/support/multiprocess.h"
#include "tests/support/world.h"

namespace hsgd::checkpoint {
namespace {

namespace fs = std::filesystem;
using testing::unique_temp_dir;

// Linear - ReLU - Dropout(0.5) - Linear: the dropout masks change every step's gradients.
std::shared_ptr<nn::Sequential> dropout_net(uint64_t init_seed, uint64_t dropout_seed,
                                            bool with_dropout = true) {
  Generator gen(init_seed);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(16, 32, true, gen));
  net->push_back(std::make_shared<nn::ReLU>());
  if (with_dropout) {
    net->push_back(std::make_shared<nn::Dropout>(0.5, dropout_seed));
  } else {
    net->push_back(std::make_shared<nn::ReLU>());  // the same tensor names, no generator
  }
  net->push_back(std::make_shared<nn::Linear>(32, 4, true, gen));
  return net;
}

// Linear - Dropout - (Linear - ReLU - Dropout) - Linear, no seeds given: the two streams derive
// from the tree seed ("1.generator", "2.2.generator").
std::shared_ptr<nn::Sequential> dropout_tree(uint64_t init_seed) {
  Generator gen(init_seed);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(16, 32, true, gen));
  net->push_back(std::make_shared<nn::Dropout>(0.3));
  auto block = std::make_shared<nn::Sequential>();
  block->push_back(std::make_shared<nn::Linear>(32, 32, true, gen));
  block->push_back(std::make_shared<nn::ReLU>());
  block->push_back(std::make_shared<nn::Dropout>(0.5));
  net->push_back(block);
  net->push_back(std::make_shared<nn::Linear>(32, 4, true, gen));
  return net;
}

nn::Dropout& dropout_of(nn::Sequential& net) {
  return dynamic_cast<nn::Dropout&>(*net.named_children()[2].second);
}

struct DropoutRun {
  std::shared_ptr<nn::Sequential> model;
  std::shared_ptr<optim::SGD> sgd;
  std::unique_ptr<data::DataLoader> loader;
  int64_t steps = 0;

  DropoutRun(uint64_t dropout_seed, int rank = 0, int world = 1, uint64_t init_seed = 1)
      : DropoutRun(dropout_net(init_seed, dropout_seed), rank, world) {}

  explicit DropoutRun(std::shared_ptr<nn::Sequential> net, int rank = 0, int world = 1)
      : model(std::move(net)) {
    sgd = std::make_shared<optim::SGD>(model->parameters(),
                                       optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    auto dataset = std::make_shared<data::SyntheticDataset>(
        data::SyntheticOptions{.size = 96, .example_shape = {16}, .num_classes = 4});
    loader = std::make_unique<data::DataLoader>(
        dataset,
        data::DataLoaderOptions{
            .batch_size = 8, .shuffle = true, .seed = 3, .rank = rank, .world_size = world});
  }

  void register_with(Checkpointer& ckpt) {
    ckpt.add_module("model", model);
    ckpt.add("optimizer", sgd);
    ckpt.add("loader", *loader);
  }

  void train_to(int64_t until, Checkpointer* ckpt = nullptr, int64_t every = 0) {
    while (steps < until) {
      loader->set_epoch(loader->epoch());
      for (const data::Batch& batch : *loader) {
        sgd->zero_grad();
        nn::cross_entropy(model->forward(batch.inputs), batch.targets).backward();
        sgd->step();
        ++steps;
        if (ckpt != nullptr && every > 0 && steps % every == 0) ckpt->save(steps);
        if (steps == until) return;
      }
      loader->set_epoch(loader->epoch() + 1);
    }
  }
};

// The index of the first element where a and b differ bitwise, or "" when they are equal.
std::string first_difference(nn::Module& a, nn::Module& b) {
  const nn::NamedTensors sa = a.state_dict(), sb = b.state_dict();
  if (sa.size() != sb.size()) return "different numbers of tensors";
  for (size_t i = 0; i < sa.size(); ++i) {
    const std::vector<float> va = sa[i].second.to_vector(), vb = sb[i].second.to_vector();
    if (va.size() != vb.size()) return sa[i].first + ": different sizes";
    for (size_t j = 0; j < va.size(); ++j) {
      if (va[j] != vb[j]) {
        return sa[i].first + "[" + std::to_string(j) + "]: " + std::to_string(va[j]) + " vs " +
               std::to_string(vb[j]);
      }
    }
  }
  return "";
}

std::shared_ptr<comm::ProcessGroup> world_of_one() {
  return comm::init_process_group(comm::InitOptions{});
}

TEST(GeneratorStateTest, BytesRoundTripAndBadBytesAreNamed) {
  Generator a(11);
  a.normal();  // leaves a spare normal: part of the state
  const std::string bytes = a.state_bytes();
  ASSERT_EQ(bytes.size(), Generator::kStateBytes);
  Generator b(99);
  b.set_state_bytes(bytes);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(a.normal(), b.normal()) << "draw " << i;
  EXPECT_EQ(a.next_u64(), b.next_u64());

  const Generator::State before = b.state();
  const auto expect_refused = [&](const std::string& bad, const std::string& needle) {
    try {
      b.set_state_bytes(bad);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(b.state().words[0], before.words[0]) << "changed by a refused state";
  };
  expect_refused(bytes.substr(0, 40), "40 bytes, expected 41");
  std::string bad_flag = bytes;
  bad_flag[40] = 7;
  expect_refused(bad_flag, "flag 7");
  std::string zeros = bytes;
  for (int i = 0; i < 32; ++i) zeros[i] = 0;
  expect_refused(zeros, "all-zero");
}

TEST(RandomStreamsTest, DropoutStreamIsRegisteredAndNotInTheStateDict) {
  auto net = dropout_net(1, 5);
  const auto generators = net->named_generators();
  ASSERT_EQ(generators.size(), 1u);
  EXPECT_EQ(generators[0].first, "2.generator");
  EXPECT_EQ(generators[0].second, &dropout_of(*net).generator());
  for (const auto& [key, t] : net->state_dict()) EXPECT_EQ(key.find("generator"), key.npos);
}

// A process trains with a checkpoint every 5 steps and is killed (SIGKILL) at step 17; a fresh
// process resumes from step 15 and trains to 30. Its parameters equal those of an uninterrupted
// run bitwise. Control: the same resume with the dropout stream restarted from its seed (what a
// checkpoint without it gives) differs, so the comparison can fail.
TEST(RandomStreamsTest, DropoutRunKilledAndResumedIsBitwiseIdentical_OneProcess) {
  const fs::path dir = unique_temp_dir("ckpt-dropout");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      DropoutRun first(/*dropout_seed=*/5);
      Checkpointer ckpt({.dir = dir.string()}, world_of_one(), {.model = "dropout-net"});
      first.register_with(ckpt);
      first.train_to(17, &ckpt, 5);
      ckpt.wait();
      ::raise(SIGKILL);
    } catch (...) {
    }
    ::_exit(3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the first run did not end by SIGKILL (status " << status << ")";

  DropoutRun uninterrupted(5);
  uninterrupted.train_to(30);

  const auto resume = [&](bool restart_stream) {
    // Another initialisation and a dropout stream already advanced: load must overwrite both.
    DropoutRun resumed(5, 0, 1, /*init_seed=*/77);
    resumed.model->forward(ones({4, 16}));
    Checkpointer ckpt({.dir = (dir / "resumed").string()}, world_of_one(),
                      {.model = "dropout-net"});
    resumed.register_with(ckpt);
    const std::optional<LoadedCheckpoint> loaded = ckpt.load((dir / "step_15").string());
    EXPECT_TRUE(loaded.has_value());
    resumed.steps = loaded ? loaded->step : 0;
    if (restart_stream) dropout_of(*resumed.model).generator().seed(5);
    resumed.train_to(30);
    return first_difference(*uninterrupted.model, *resumed.model);
  };
  EXPECT_EQ(resume(false), "") << "the resumed run differs from the uninterrupted one";
  EXPECT_NE(resume(true), "") << "restarting the dropout stream changed nothing";
}

// A tree of unseeded dropout layers: the job saves at 8 and ends at 10; a fresh model (streams
// derived anew, i.e. restarted) loads step 8 and trains to 20, bitwise where an uninterrupted run
// ends. Control: without the loaded streams (the tree reseeded after the load) it ends elsewhere.
TEST(RandomStreamsTest, TreeOfUnseededDropouts_ResumesEveryStream) {
  const fs::path dir = unique_temp_dir("ckpt-dropout-tree");
  {
    DropoutRun first(dropout_tree(1));
    ASSERT_EQ(first.model->named_generators().size(), 2u);
    Checkpointer ckpt({.dir = dir.string()}, world_of_one(), {.model = "dropout-tree"});
    first.register_with(ckpt);
    first.train_to(10, &ckpt, 8);
    ckpt.wait();
  }
  DropoutRun uninterrupted(dropout_tree(1));
  uninterrupted.train_to(20);
  const auto resume = [&](bool restart_streams) {
    DropoutRun resumed(dropout_tree(/*init_seed=*/77));
    resumed.model->forward(ones({4, 16}));  // streams advanced: load must overwrite them
    Checkpointer ckpt({.dir = (dir / "resumed").string()}, world_of_one(),
                      {.model = "dropout-tree"});
    resumed.register_with(ckpt);
    const std::optional<LoadedCheckpoint> loaded = ckpt.load(step_dir(dir.string(), 8));
    EXPECT_TRUE(loaded.has_value());
    resumed.steps = loaded ? loaded->step : 0;
    if (restart_streams) resumed.model->seed_generators(initial_seed());
    resumed.train_to(20);
    return first_difference(*uninterrupted.model, *resumed.model);
  };
  EXPECT_EQ(resume(false), "") << "the resumed tree differs from the uninterrupted one";
  EXPECT_NE(resume(true), "") << "restarting the streams changed nothing";
}

// Two ranks whose dropout streams differ (seed 100 + rank): each rank's file holds its own
// stream. The first job saves at 6 and 12 and ends at 14; a new job resumes from 12 and trains
// to 24; every rank ends bitwise equal to its uninterrupted run.
TEST(RandomStreamsTest, EveryRankResumesItsOwnDropoutStream) {
  const fs::path dir = unique_temp_dir("ckpt-dropout-ranks");
  constexpr int kWorld = 2;
  auto result =
      testing::run_world(kWorld, [&](int rank, const std::shared_ptr<comm::ProcessGroup>& pg) {
        DropoutRun run(100 + rank, rank, kWorld);
        Checkpointer ckpt({.dir = dir.string()}, pg, {.model = "dropout-net"});
        run.register_with(ckpt);
        run.train_to(14, &ckpt, 6);
        ckpt.wait();
      });
  ASSERT_RANKS_OK(result);

  result = testing::run_world(kWorld, [&](int rank, const std::shared_ptr<comm::ProcessGroup>& pg) {
    DropoutRun resumed(100 + rank, rank, kWorld, /*init_seed=*/42);
    Checkpointer ckpt({.dir = dir.string()}, pg, {.model = "dropout-net"});
    resumed.register_with(ckpt);
    const std::optional<LoadedCheckpoint> loaded = ckpt.load();
    ASSERT_TRUE(loaded.has_value());
    ASSERT_EQ(loaded->step, 12);
    resumed.steps = loaded->step;
    resumed.train_to(24);
    DropoutRun uninterrupted(100 + rank, rank, kWorld);
    uninterrupted.train_to(24);
    EXPECT_EQ(first_difference(*uninterrupted.model, *resumed.model), "") << "rank " << rank;
  });
  EXPECT_RANKS_OK(result);
}

// Writes DIR/step_<step> from a model with the same tensors as dropout_net but no generator, and
// marks the manifest partial or not.
void write_without_generator(const fs::path& dir, int64_t step, bool partial) {
  {
    Checkpointer ckpt({.dir = dir.string()}, world_of_one(), {.model = "dropout-net"});
    ckpt.add_module("model", dropout_net(1, 5, /*with_dropout=*/false));
    ckpt.save(step);
  }
  const std::string manifest_path = step_dir(dir.string(), step) + "/" + kManifestName;
  proto::Manifest manifest;
  ASSERT_TRUE(manifest.ParseFromString(read_envelope(manifest_path, kManifestKind)));
  manifest.set_partial(partial);
  write_envelope(manifest_path, kManifestKind, manifest.SerializeAsString());
}

TEST(RandomStreamsTest, ACheckpointWithoutTheGeneratorIsRefusedUnlessPartial) {
  const fs::path dir = unique_temp_dir("ckpt-no-generator");
  write_without_generator(dir / "complete", 3, /*partial=*/false);
  write_without_generator(dir / "partial", 3, /*partial=*/true);

  auto net = dropout_net(2, 5);
  Checkpointer ckpt({.dir = (dir / "run").string()}, world_of_one(), {.model = "dropout-net"});
  ckpt.add_module("model", net);
  try {
    ckpt.load(step_dir((dir / "complete").string(), 3));
    FAIL() << "a checkpoint without the dropout stream was loaded";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no state for the generator 'model.2.generator'"),
              std::string::npos)
        << e.what();
  }
  // Partial: the tensors load and the stream is left where it was.
  Generator expected = dropout_of(*net).generator();
  const std::optional<LoadedCheckpoint> loaded = ckpt.load(step_dir((dir / "partial").string(), 3));
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(first_difference(*net, *dropout_net(1, 5)), "");
  EXPECT_EQ(dropout_of(*net).generator().next_u64(), expected.next_u64());
}

// RunInfo leaves local_world_size 0: the manifest records the process group's (the launcher's
// LOCAL_WORLD_SIZE), 2 for 4 ranks on emulated nodes of 2.
TEST(RandomStreamsTest, ManifestRecordsTheProcessGroupsLocalWorldSize) {
  const fs::path dir = unique_temp_dir("ckpt-local-world");
  auto result = testing::run_world(4, {.local_world_size = 2},
                                   [&](int rank, const std::shared_ptr<comm::ProcessGroup>& pg) {
                                     Checkpointer ckpt({.dir = dir.string()}, pg, {.model = "m"});
                                     ckpt.add_module("model", dropout_net(1, rank));
                                     EXPECT_EQ(ckpt.run().local_world_size, 2);
                                     ckpt.save(1);
                                     ckpt.wait();
                                   });
  ASSERT_RANKS_OK(result);
  proto::Manifest manifest;
  ASSERT_TRUE(manifest.ParseFromString(
      read_envelope(step_dir(dir.string(), 1) + "/" + kManifestName, kManifestKind)));
  EXPECT_EQ(manifest.run().world_size(), 4);
  EXPECT_EQ(manifest.run().local_world_size(), 2);
}

}  // namespace
}  // namespace hsgd::checkpoint
