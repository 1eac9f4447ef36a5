// Replica checks, collective labels and collectives on Tensors, over separate processes:
// - a model that differs between ranks fails at DistributedDataParallel / averager construction
//   (and at the averagers' first averaging) with hsgd::InvalidArgument on EVERY rank, naming the
//   first differing tensor and the ranks with each shape, also when the total sizes are equal;
// - the library's own collectives carry labels, so a broken call order names them;
// - collectives on Tensors and AveragedReplicas (parameters and buffers, restored afterwards),
//   also through an averager whose top level compresses (the same bits on every rank, near the
//   mean, fewer bytes than float32's) or does not (exactly the float32 average).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/distributed/averaged_replicas.h"
#include "framework/distributed/ddp.h"
#include "framework/distributed/model_averaging/averagers.h"
#include "framework/distributed/model_averaging/hierarchical_model_averager.h"
#include "framework/distributed/model_averaging/hierarchy_text.h"
#include "framework/distributed/tensor_collectives.h"
#include "framework/nn/nn.h"
#include "tests/framework/distributed/dist_test_util.h"
#include "tests/support/error_message.h"
#include "tests/support/world.h"

namespace hsgd::distributed {
namespace {

using hsgd::testing::error_message;
using hsgd::testing::expect_all_equal;
using hsgd::testing::run_world;
using ::testing::HasSubstr;

// Linear(4, hidden) -> ReLU -> Linear(hidden, 3), named "0.weight", "0.bias", "2.weight", ...
std::shared_ptr<nn::Module> make_mlp(int64_t hidden) {
  Generator gen(7);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(4, hidden, true, gen));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(hidden, 3, true, gen));
  return net;
}

// Parameters "a" then "b" (or "b" then "a"), each of the given shape; a buffer "stats" (3,).
class Pair : public nn::Module {
 public:
  Pair(Shape a, Shape b, bool swap_names = false) {
    register_parameter(swap_names ? "b" : "a", zeros(a).set_requires_grad(true));
    register_parameter(swap_names ? "a" : "b", zeros(b).set_requires_grad(true));
    register_buffer("stats", zeros({3}));
  }
};

// After a failed check the group still works: the check communicated the same way everywhere.
void expect_group_usable(const std::shared_ptr<comm::ProcessGroup>& pg) {
  Tensor x = ones({2});
  allreduce(*pg, x);
  expect_all_equal(x, static_cast<float>(pg->size()), "allreduce after the failed check");
}

TEST(ReplicaCheck, DdpWithAWiderLayerOnOneRank_FailsOnEveryRankNamingTheParameter) {
  auto result = run_world(4, [&](int rank, const auto& pg) {
    auto model = make_mlp(rank == 1 ? 20 : 16);
    const std::string message = error_message([&] { DistributedDataParallel ddp(model, pg); });
    EXPECT_THAT(message, HasSubstr("DistributedDataParallel: the model differs between the ranks "
                                   "of group 'world': parameter '0.weight' (tensor 0) has shape "
                                   "[16, 4] on ranks 0, 2, 3 and [20, 4] on rank 1"))
        << "rank " << rank;
    expect_group_usable(pg);
  });
  EXPECT_RANKS_OK(result);
}

TEST(ReplicaCheck, SameTotalSizeDifferentShapes_IsCaught) {
  auto result = run_world(3, [&](int rank, const auto& pg) {
    // 6 x 4 and 4 x 6: a flat broadcast would succeed and scramble the weights.
    auto model = std::make_shared<Pair>(rank == 2 ? Shape{4, 6} : Shape{6, 4}, Shape{5});
    const std::string message = error_message([&] { DistributedDataParallel ddp(model, pg); });
    EXPECT_THAT(message,
                HasSubstr("parameter 'a' (tensor 0) has shape [6, 4] on ranks 0, 1 and [4, 6] "
                          "on rank 2"))
        << "rank " << rank;
    expect_group_usable(pg);
  });
  EXPECT_RANKS_OK(result);
}

TEST(ReplicaCheck, DifferentOrderAndMissingTensors_AreNamed) {
  auto result = run_world(3, [&](int rank, const auto& pg) {
    auto swapped = std::make_shared<Pair>(Shape{3}, Shape{3}, /*swap_names=*/rank == 1);
    std::string message = error_message([&] { DistributedDataParallel ddp(swapped, pg); });
    EXPECT_THAT(message, HasSubstr("tensor 0 is parameter 'a' [3] on ranks 0, 2 and parameter "
                                   "'b' [3] on rank 1"))
        << "rank " << rank;
    // Rank 0 has a buffer fewer (through the averager's buffers).
    std::vector<Tensor> buffers{zeros({2}), zeros({2})};
    if (rank == 0) buffers.pop_back();
    message = error_message(
        [&] { PeriodicModelAverager averager(2, 0, pg, {.average_buffers = buffers}); });
    EXPECT_THAT(message, HasSubstr("PeriodicModelAverager: options.average_buffers differs"))
        << message;
    EXPECT_THAT(message,
                HasSubstr("tensor 1 is missing (fewer tensors) on rank 0 and buffer 1 [2] on "
                          "ranks 1, 2"))
        << message;
    expect_group_usable(pg);
  });
  EXPECT_RANKS_OK(result);
}

TEST(ReplicaCheck, AveragerComparesWhatItAveragesAtItsFirstAveraging) {
  auto result = run_world(4, [&](int rank, const auto& pg) {
    HierarchicalModelAverager averager({{1, 2}, {2, kWholeGroup}}, 0, pg);
    Tensor a = zeros({rank == 3 ? 7 : 5}).set_requires_grad(true);
    a.set_grad(ones(a.shape()));
    const std::string message =
        error_message([&] { averager.average_parameters(std::vector<Tensor>{a}); });
    EXPECT_THAT(message, HasSubstr("HierarchicalModelAverager: what to average (parameters with "
                                   "a gradient, then buffers) differs"));
    EXPECT_THAT(message, HasSubstr("has shape [5] on ranks 0-2 and [7] on rank 3"));
    expect_group_usable(pg);
  });
  EXPECT_RANKS_OK(result);
}

// A broken call order seen in training: the averager called on rank 0 only, while the others go on
// with DDP's training forward (its buffer broadcast). Every rank names both library collectives.
TEST(CollectiveLabels, AveragerOnOneRankOnly_NamesTheAveragerAndDdpBuffers) {
  hsgd::testing::WorldOptions options;
  options.timeout = std::chrono::milliseconds(4000);
  auto result = run_world(4, options, [&](int rank, const auto& pg) {
    auto model = std::make_shared<nn::Sequential>();
    model->push_back(std::make_shared<nn::Conv2d>(
        nn::Conv2dOptions{.in_channels = 1, .out_channels = 2, .kernel_size = {3, 3}}));
    model->push_back(std::make_shared<nn::BatchNorm2d>(2));
    DistributedDataParallel ddp(model, pg);
    PeriodicModelAverager averager(1, 0, pg);  // warns: period 1
    std::vector<Tensor> params = model->parameters();
    for (Tensor& p : params) p.set_grad(ones(p.shape()));
    averager.average_parameters(params);  // every rank: checks the tensors, then averages
    const std::string message = error_message<Timeout>([&] {
      if (rank == 0) {
        averager.average_parameters(params);
      } else {
        ddp.forward(ones({1, 1, 4, 4}));
      }
    });
    // 2*1*3*3 + 2 conv parameters, 2 + 2 BatchNorm parameters; buffers: 2 + 2 + 1.
    EXPECT_THAT(message, HasSubstr("rank 0 is in allreduce (24 x float, sum) #"));
    EXPECT_THAT(message, HasSubstr("'averager 1:4'"));
    EXPECT_THAT(message, HasSubstr("ranks 1-3 are in broadcast (5 x float, root 0) #"));
    EXPECT_THAT(message, HasSubstr("'DDP buffers'"));
  });
  EXPECT_RANKS_OK(result);
}

TEST(TensorCollectives, AllreduceAndBroadcastTensors_IncludingViewsAndLists) {
  for (int world : {1, 3}) {
    auto result = run_world(world, [&](int rank, const auto& pg) {
      const float r = static_cast<float>(rank);
      Tensor x = full({2, 3}, r + 1);
      allreduce(*pg, x);
      const float sum = static_cast<float>(world * (world + 1) / 2);
      expect_all_equal(x, sum, "allreduce sum");
      Tensor y = full({4}, r);
      allreduce(*pg, y, comm::ReduceOp::kMax, "max");
      expect_all_equal(y, static_cast<float>(world - 1), "allreduce max");
      // A non-contiguous view: written back into the storage it views.
      Tensor base = from_vector({r, r, r, r, r, r}, {2, 3});
      Tensor view = base.t();
      broadcast(*pg, view, world - 1);
      expect_all_equal(base, static_cast<float>(world - 1), "broadcast into a transposed view");
      // Lists: one coalesced collective.
      std::vector<Tensor> list{full({2}, r), full({3, 1}, 2 * r)};
      allreduce(*pg, list, comm::ReduceOp::kAvg);
      const float mean = static_cast<float>(world - 1) / 2;
      expect_all_equal(list[0], mean, "list[0]");
      expect_all_equal(list[1], 2 * mean, "list[1]");
      EXPECT_THROW(allreduce(*pg, std::vector<Tensor>{Tensor()}), InvalidArgument);
    });
    EXPECT_RANKS_OK(result);
  }
}

TEST(AveragedReplicas, SwapsInTheAverageOfParametersAndBuffersThenRestores) {
  for (int world : {1, 2, 3}) {
    auto result = run_world(world, [&](int rank, const auto& pg) {
      // No backward has run: no parameter has a gradient, and the buffer is not a parameter.
      auto model = std::make_shared<Pair>(Shape{2, 2}, Shape{3});
      const float r = static_cast<float>(rank);
      for (Tensor& p : model->parameters()) p.detach().fill_(r);
      model->buffers()[0].fill_(10 * r);
      const float mean = static_cast<float>(world - 1) / 2;
      {
        AveragedReplicas average(pg, model);
        for (const Tensor& p : model->parameters()) expect_all_equal(p, mean, "averaged param");
        expect_all_equal(model->buffers()[0], 10 * mean, "averaged buffer");
      }
      for (const Tensor& p : model->parameters()) expect_all_equal(p, r, "restored param");
      expect_all_equal(model->buffers()[0], 10 * r, "restored buffer");
      {
        AveragedReplicas average(pg, model);
        average.keep();
      }
      for (const Tensor& p : model->parameters()) expect_all_equal(p, mean, "kept param");
      expect_all_equal(model->buffers()[0], 10 * mean, "kept buffer");
    });
    EXPECT_RANKS_OK(result);
  }
}

// The values of the model's parameters, flat, in order.
std::vector<float> values_of(const nn::Module& model) {
  std::vector<float> out;
  for (const Tensor& p : model.parameters()) {
    const std::vector<float> v = p.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// Every rank's values, rank after rank (a collective of the test).
std::vector<std::vector<float>> gather_values(comm::ProcessGroup& pg,
                                              const std::vector<float>& mine) {
  std::vector<float> all(mine.size() * static_cast<size_t>(pg.size()));
  pg.allgather(std::span<const float>(mine), std::span<float>(all), "test values")->wait();
  std::vector<std::vector<float>> out;
  for (int r = 0; r < pg.size(); ++r) {
    out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(r * mine.size()),
                     all.begin() + static_cast<std::ptrdiff_t>((r + 1) * mine.size()));
  }
  return out;
}

// Ten steps of a hierarchy on 2 nodes x 2 ranks from a common start, each rank moving its
// replica its own way: the replicas differ, and the top level holds anchors.
void train_apart(nn::Module& model, ModelAverager& averager, int rank) {
  for (Tensor& p : model.parameters()) p.set_grad(zeros(p.shape()));
  ASSERT_TRUE(averager.start_from(model.parameters()));
  for (int t = 0; t < 10; ++t) {
    for (Tensor& p : model.parameters()) {
      std::vector<float> v = p.to_vector();
      for (size_t i = 0; i < v.size(); ++i) {
        v[i] += 0.001f * static_cast<float>((rank + 1) * (t + 1)) *
                std::sin(0.1f * static_cast<float>(i) + static_cast<float>(rank));
      }
      p.detach().copy_(from_vector(v, p.shape()));
    }
    averager.average_parameters(model.parameters());
  }
}

// Through a top level of 4 int4 fragments with error feedback (a fragment in flight at the
// evaluation), on 2 emulated nodes: every rank holds the same bits, within int4's rounding of
// the exact mean; the local values come back; the top level's anchors are unchanged; and only
// the node leaders write to the connections, under a byte a value (int4 is 17/32 of a byte and
// a float32 step per block of 256; float32 would be 4 bytes a value of the rank's shard).
TEST(AveragedReplicas, ThroughACompressedTopLevel_SameBitsNearTheMeanFewerBytes) {
  auto result = run_world(4, {.local_world_size = 2}, [&](int rank, const auto& world) {
    const testing::CountedGroup counted = testing::counted_group(*world, "counted");
    auto model = make_mlp(2048);  // 16,387 values
    HierarchicalModelAverager averager(parse_hierarchy("1:2,8:world@fragments=4,int4,ef"), 0,
                                       counted.pg);
    train_apart(*model, averager, rank);
    const std::vector<float> local = values_of(*model);
    const std::vector<std::vector<float>> all = gather_values(*world, local);
    const StateDict anchors = averager.settled_level_state(1);
    // The first averaging through the averager makes its node and leader groups.
    { AveragedReplicas warm_up(counted.pg, *model, averager); }
    std::vector<float> averaged;
    const uint64_t before = counted.bytes_sent();
    {
      AveragedReplicas average(counted.pg, *model, averager);
      averaged = values_of(*model);
    }
    const uint64_t sent = counted.bytes_sent() - before;
    EXPECT_EQ(values_of(*model), local) << "the local values are back";
    const bool leader = rank % 2 == 0;
    EXPECT_LT(sent, leader ? local.size() : 1024) << "bytes written by rank " << rank;
    if (leader) EXPECT_GT(sent, local.size() / 2) << "a leader sends about 17/32 of a byte a value";
    const std::vector<std::vector<float>> every = gather_values(*world, averaged);
    for (int r = 1; r < 4; ++r) EXPECT_EQ(every[static_cast<size_t>(r)], every[0]) << "rank " << r;
    for (size_t i = 0; i < averaged.size(); ++i) {
      double mean = 0;
      for (const std::vector<float>& v : all) mean += v[i];
      mean /= 4;
      ASSERT_NEAR(averaged[i], mean, 0.02) << "value " << i;
    }
    const StateDict after = averager.settled_level_state(1);
    ASSERT_EQ(after.size(), anchors.size());
    for (size_t e = 0; e < anchors.size(); ++e) {
      const auto& [key, value] = anchors.entries()[e];
      EXPECT_EQ(after.get_tensor(key).to_vector(), std::get<Tensor>(value).to_vector()) << key;
    }
    EXPECT_TRUE(averager.has_pending()) << "the test meant to evaluate with a fragment in flight";
  });
  EXPECT_RANKS_OK(result);
}

// A compressed top level averages the buffers (running statistics) exactly, in float32, beside
// its compressed parameters: small positive variances next to large parameter changes stay the
// float32 mean (int4 would round them to multiples of the block's step, and below zero), in the
// level's averagings and in the evaluated average of the replicas.
TEST(AveragedReplicas, CompressedTopLevel_AveragesBuffersExactly) {
  auto result = run_world(4, {.local_world_size = 2}, [&](int rank, const auto& world) {
    const auto r = static_cast<float>(rank);
    Tensor param = zeros({100});
    param.set_grad(zeros({100}));
    Tensor running_var = zeros({20});
    HierarchicalModelAverager averager(parse_hierarchy("1:2,4:world@int4,ef"), 0, world,
                                       ModelAveragerOptions{.average_buffers = {running_var}});
    const auto set_values = [&](int64_t step) {
      std::vector<float> p(100), v(20);
      for (size_t i = 0; i < p.size(); ++i) {
        p[i] = 50.0f * std::sin(0.1f * static_cast<float>(i) + r + static_cast<float>(step));
      }
      for (size_t i = 0; i < v.size(); ++i) {
        v[i] = 1e-3f * (r + 1.0f) + 1e-4f * static_cast<float>(i) / static_cast<float>(step + 1);
      }
      param.detach().copy_(from_vector(p, {100}));
      running_var.copy_(from_vector(v, {20}));
      return v;
    };
    const auto expect_mean = [&](const std::vector<float>& mine, const std::string& what) {
      const std::vector<std::vector<float>> all = gather_values(*world, mine);
      const std::vector<float> got = running_var.to_vector();
      for (size_t i = 0; i < got.size(); ++i) {
        double mean = 0;
        for (const std::vector<float>& v : all) mean += v[i];
        mean /= 4;
        ASSERT_GT(got[i], 0.0f) << what << ", value " << i;
        ASSERT_NEAR(got[i], mean, 1e-6 * mean) << what << ", value " << i;
      }
    };
    for (int64_t step = 0; step < 13; ++step) {
      const std::vector<float> mine = set_values(step);
      averager.average_parameters(std::vector<Tensor>{param});
      if (step % 4 == 0) expect_mean(mine, "the top level at step " + std::to_string(step));
    }
    const std::vector<float> mine = set_values(13);
    EXPECT_EQ(averager.average_replicas(std::vector<Tensor>{param}).size(), 2u)
        << "the evaluated average went through the int4 level";
    expect_mean(mine, "the evaluated average");
  });
  EXPECT_RANKS_OK(result);
}

// A run resumed after its last step evaluates with a new averager loaded from the checkpointed
// state, on the same values before any backward (no gradients): the same bits as the run that
// wrote the checkpoint.
TEST(AveragedReplicas, ThroughAnAveragerLoadedFromItsState_SameBitsWithoutGradients) {
  auto result = run_world(4, {.local_world_size = 2}, [&](int rank, const auto& world) {
    const auto levels = parse_hierarchy("1:2,8:world@fragments=2,int8,ef");
    auto model = make_mlp(64);
    HierarchicalModelAverager averager(levels, 0, world);
    train_apart(*model, averager, rank);
    averager.finish_pending(model->parameters());  // as the runtime does before keeping
    auto resumed = make_mlp(64);
    resumed->load_state_dict(model->state_dict());
    HierarchicalModelAverager loaded(levels, 0, world);
    loaded.load_state_dict(averager.state_dict());
    {
      AveragedReplicas average(world, *model, averager);
      average.keep();
    }
    EXPECT_EQ(loaded.average_replicas(resumed->parameters()).size(), 4u)
        << "every parameter went through the int8 level";
    EXPECT_EQ(values_of(*resumed), values_of(*model));
  });
  EXPECT_RANKS_OK(result);
}

// Through a float32 top level the average is the float32 one, bit for bit, and kept on request.
TEST(AveragedReplicas, ThroughAFloat32TopLevel_IsTheFloat32Average) {
  auto result = run_world(4, {.local_world_size = 2}, [&](int rank, const auto& world) {
    auto model = make_mlp(64);
    HierarchicalModelAverager averager(parse_hierarchy("1:2,8:world"), 0, world);
    for (Tensor& p : model->parameters()) p.set_grad(zeros(p.shape()));
    for (Tensor& p : model->parameters()) p.detach().add_(full(p.shape(), 0.125f * rank));
    EXPECT_TRUE(averager.average_replicas(model->parameters()).empty());
    std::vector<float> float32;
    {
      AveragedReplicas average(world, *model);
      float32 = values_of(*model);
    }
    {
      AveragedReplicas average(world, *model, averager);
      average.keep();
    }
    EXPECT_EQ(values_of(*model), float32);
  });
  EXPECT_RANKS_OK(result);
}

}  // namespace
}  // namespace hsgd::distributed
