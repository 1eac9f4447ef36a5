// The training runtime (framework/runtime/runtime.h) in fixed-size worlds: it computes what the
// README's loop written by hand computes, a run resumed from its checkpoint ends where an
// uninterrupted one does, and the registered state round-trips.

#include "framework/runtime/runtime.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "comm/process_group/init.h"
#include "framework/data/synthetic_dataset.h"
#include "framework/distributed/averaged_replicas.h"
#include "framework/distributed/comm_hooks/post_local_sgd_hook.h"
#include "framework/distributed/ddp.h"
#include "framework/distributed/model_averaging/hierarchical_model_averager.h"
#include "framework/nn/functional.h"
#include "models/mlp.h"
#include "optim/sgd.h"
#include "tests/support/multiprocess.h"
#include "tests/support/world.h"

namespace hsgd::runtime {
namespace {

std::shared_ptr<const data::Dataset> dataset() {
  return std::make_shared<data::SyntheticDataset>(
      data::SyntheticOptions{.size = 512, .example_shape = {20}, .num_classes = 4, .seed = 3});
}

std::shared_ptr<models::MLP> model() {
  return std::make_shared<models::MLP>(models::MLPOptions{.sizes = {20, 16, 4}, .seed = 7});
}

std::shared_ptr<Optimizer> sgd(const std::shared_ptr<nn::Module>& m) {
  return std::make_shared<optim::SGD>(m->parameters(),
                                      optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
}

Tensor classification_step(StepContext& step, const data::Batch& batch) {
  Tensor loss = nn::cross_entropy(step.forward(batch.inputs), batch.targets);
  loss.backward();
  return loss;
}

std::vector<float> flat(nn::Module& m) {
  std::vector<float> out;
  for (const Tensor& p : m.parameters()) {
    const std::vector<float> v = p.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

void expect_bitwise_equal(const std::vector<float>& expected, const std::vector<float>& actual,
                          int rank) {
  ASSERT_EQ(expected.size(), actual.size()) << "rank " << rank;
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(expected[i], actual[i]) << "rank " << rank << " parameter value " << i;
  }
}

const std::vector<distributed::LevelOptions> kLevels = {{.period = 2, .group_size = 2},
                                                        {.period = 4, .group_size = 4}};

TEST(RuntimeTest, FixedWorld_ComputesWhatTheLoopWrittenByHandComputes_Hierarchical) {
  auto result = testing::run_world(4, {.local_world_size = 2}, [](int rank, const auto& world) {
    constexpr int64_t kSteps = 12;
    // By hand: DDP with the post-local hook, the averager after each optimizer step.
    auto by_hand = model();
    {
      distributed::DistributedDataParallel ddp(by_hand, world);
      ddp.register_comm_hook(
          std::make_shared<distributed::PostLocalSGDState>(
              distributed::PostLocalSGDState{.process_group = world, .start_localSGD_iter = 3}),
          distributed::post_localSGD_hook);
      distributed::HierarchicalModelAverager averager(kLevels, 3, world);
      auto opt = sgd(by_hand);
      data::DataLoader loader(
          dataset(), {.batch_size = 8, .shuffle = true, .seed = 5, .rank = rank, .world_size = 4});
      loader.set_epoch(0);
      int64_t steps = 0;
      for (const data::Batch& batch : loader) {
        if (steps++ == kSteps) break;
        opt->zero_grad();
        nn::cross_entropy(ddp.forward(batch.inputs), batch.targets).backward();
        opt->step();
        averager.average_parameters(by_hand->parameters());
      }
      // The end of the run: every rank keeps the average of the replicas.
      distributed::AveragedReplicas(world, by_hand).keep();
    }
    // The runtime, from the same start.
    auto m = model();
    Runtime rt({.parallel = {.mode = Mode::kHierarchical, .levels = kLevels, .warmup_steps = 3},
                .world = world,
                .loader = {.batch_size = 8, .shuffle = true, .seed = 5},
                .max_steps = kSteps});
    rt.register_model(m);
    rt.register_optimizer(sgd(m));
    const RunResult run = rt.run(dataset(), classification_step);
    EXPECT_EQ(run.step, kSteps);
    EXPECT_FALSE(run.preempted);
    ASSERT_EQ(run.averaging.size(), 2u);
    EXPECT_EQ(run.averaging[1].calls, 2) << "the 4-step level averages at steps 4 and 8";
    expect_bitwise_equal(flat(*by_hand), flat(*m), rank);
  });
  EXPECT_RANKS_OK(result);
}

// Runs the local-SGD job for max_steps steps on 2 ranks and writes each rank's parameters to
// out/rank_<r>.
void run_local_sgd(const std::string& checkpoint_dir, int64_t max_steps, const std::string& out) {
  auto result = testing::run_world(2, {.local_world_size = 2}, [&](int rank, const auto& world) {
    auto m = model();
    Runtime rt(
        {.parallel = {.mode = Mode::kLocalSGD, .levels = {{.period = 3}}, .subgroup_size = 1},
         .world = world,
         .loader = {.batch_size = 8, .shuffle = true, .seed = 5},
         .epochs = 2,
         .max_steps = max_steps,
         .checkpoint = {.dir = checkpoint_dir, .every = 4}});
    rt.register_model(m);
    rt.register_optimizer(sgd(m));
    const RunResult run = rt.run(dataset(), classification_step);
    EXPECT_EQ(run.step, max_steps);
    std::ofstream(out + "/rank_" + std::to_string(rank), std::ios::binary)
        .write(reinterpret_cast<const char*>(flat(*m).data()),
               static_cast<std::streamsize>(flat(*m).size() * sizeof(float)));
  });
  EXPECT_RANKS_OK(result);
}

std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

TEST(RuntimeTest, ResumedFromItsCheckpoint_EndsBitwiseWhereAnUninterruptedRunEnds) {
  const std::string dir = testing::unique_temp_dir("runtime_resume").string();
  const std::string whole = dir + "/whole", resumed = dir + "/resumed", ckpt = dir + "/ckpt";
  std::filesystem::create_directories(whole);
  std::filesystem::create_directories(resumed);
  // 40 steps cross the epoch boundary (32 batches per rank per epoch) after the checkpoint at 28.
  run_local_sgd("", 40, whole);
  run_local_sgd(ckpt, 30, resumed);  // checkpoints every 4 steps; the steps after 28 are lost
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/step_28/manifest"));
  run_local_sgd(ckpt, 40, resumed);  // resumes at 28
  for (int rank = 0; rank < 2; ++rank) {
    const std::string name = "/rank_" + std::to_string(rank);
    expect_bitwise_equal(read_floats(whole + name), read_floats(resumed + name), rank);
  }
  std::filesystem::remove_all(dir);
}

// The manifest records the hierarchy in its canonical form: a run that spells the same hierarchy
// another way resumes from it; a different hierarchy is refused, naming both.
TEST(RuntimeTest, Resume_ComparesTheHierarchyByMeaningNotSpelling) {
  const std::string dir = testing::unique_temp_dir("runtime_hierarchy").string();
  const auto run = [&](const std::string& hierarchy, int64_t max_steps) {
    auto m = model();
    RuntimeOptions options;
    options.world = comm::init_process_group(comm::InitOptions{});
    options.loader.batch_size = 8;
    options.max_steps = max_steps;
    options.checkpoint = {.dir = dir, .every = 4};
    options.hierarchy_text = hierarchy;
    Runtime rt(std::move(options));
    rt.register_model(m);
    rt.register_optimizer(sgd(m));
    return rt.run(dataset(), classification_step);
  };
  EXPECT_EQ(run("8:world@outer=0.7", 4).step, 4);
  EXPECT_EQ(run("8:world@outer=0.7/0", 8).step, 8);
  try {
    run("8:world@outer=0.5", 12);
    FAIL() << "expected the checkpoint of another hierarchy to be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outer=0.5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("outer=0.7"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(RuntimeTest, StepFunctionReturningNoScalar_IsRefusedNamingTheShape) {
  auto m = model();
  Runtime rt({.world = comm::init_process_group(comm::InitOptions{}), .loader = {.batch_size = 8}});
  rt.register_model(m);
  rt.register_optimizer(sgd(m));
  try {
    rt.run(dataset(), [](StepContext& step, const data::Batch& batch) {
      return step.forward(batch.inputs);  // the logits, not the loss
    });
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("[8, 4]"), std::string::npos) << e.what();
  }
}

TEST(TrainingStateTest, RoundTrip_RestoresModelOptimizerGeneratorAndCounters) {
  auto m = model();
  auto opt = sgd(m);
  Generator gen(11);
  int64_t counter = 5;
  TrainingState state;
  state.add_module("model", m);
  state.add("optimizer", opt);
  state.add_generator("noise", gen);
  state.add(
      "counter",
      [&] {
        StateDict s;
        s.set("value", counter);
        return s;
      },
      [&](const StateDict& s) { counter = s.get_int("value"); });
  const std::vector<float> before = flat(*m);
  const StateDict saved = state.state_dict();
  const float first_draw = gen.uniform(0.0f, 1.0f);
  {
    NoGradGuard no_grad;
    for (Tensor& p : m->parameters()) p.zero_();
  }
  counter = 0;
  state.load_state_dict(saved);
  expect_bitwise_equal(before, flat(*m), 0);
  EXPECT_EQ(counter, 5);
  EXPECT_EQ(gen.uniform(0.0f, 1.0f), first_draw)
      << "the generator continues from the saved position";
  StateDict missing;
  missing.merge("model.", saved.with_prefix("model."));
  try {
    state.load_state_dict(missing);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'optimizer'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hsgd::runtime
