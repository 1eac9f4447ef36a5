// DistributedDataParallel over separate processes: gradients equal the average of the ranks'
// own gradients (each rank recomputes every rank's gradient locally on a replica as the
// reference), for an MLP and a conv+BN net, with one and with many buckets; unused parameters;
// no_sync; overlap of communication with backward; post_localSGD_hook; hook registration.

#include "framework/distributed/ddp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/error.h"
#include "framework/distributed/comm_hooks/default_hooks.h"
#include "framework/distributed/comm_hooks/post_local_sgd_hook.h"
#include "framework/nn/nn.h"
#include "framework/tensor/ops.h"
#include "tests/framework/distributed/dist_test_util.h"
#include "tests/support/world.h"

namespace hsgd::distributed {
namespace {

using hsgd::testing::run_world;

constexpr double kTolerance = 1e-6;

// Many tiny buckets: each holds one or two parameters of the test nets.
const DDPOptions kTinyBuckets{.bucket_cap_mb = 0.0005, .first_bucket_cap_mb = 0.0002};

// Rank-dependent initialisation, so that only DDP's broadcast makes the replicas equal.
std::shared_ptr<nn::Module> make_mlp(uint64_t seed) {
  Generator gen(seed);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(6, 16, true, gen));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(16, 12, true, gen));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(12, 3, true, gen));
  return net;
}

std::shared_ptr<nn::Module> make_conv_bn(uint64_t seed) {
  Generator gen(seed);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Conv2d>(
      nn::Conv2dOptions{
          .in_channels = 3, .out_channels = 4, .kernel_size = {3, 3}, .padding = {1, 1}},
      gen));
  net->push_back(std::make_shared<nn::BatchNorm2d>(4));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Flatten>());
  net->push_back(std::make_shared<nn::Linear>(4 * 5 * 5, 3, true, gen));
  return net;
}

// The batch of rank r at iteration it: inputs of the given shape and 3-class targets.
struct Batch {
  Tensor x;
  std::vector<int64_t> y;
};
Batch make_batch(int r, int it, const Shape& shape) {
  Generator gen(1000 + 17 * static_cast<uint64_t>(r) + static_cast<uint64_t>(it));
  Batch b{randn(shape, gen), {}};
  for (int64_t i = 0; i < shape[0]; ++i) b.y.push_back(static_cast<int64_t>(gen.next_below(3)));
  return b;
}

using Grads = std::vector<std::vector<float>>;  // per parameter, flattened

Grads zero_grads(const nn::Module& m) {
  Grads g;
  for (const Tensor& p : m.parameters()) g.emplace_back(static_cast<size_t>(p.numel()), 0.0f);
  return g;
}

// d loss / d params of `model` on batch b (grads cleared first).
Grads local_grads(nn::Module& model, const Batch& b) {
  for (Tensor p : model.parameters()) p.set_grad(Tensor());
  cross_entropy(model.forward(b.x), b.y).backward();
  Grads g;
  for (const Tensor& p : model.parameters()) {
    g.push_back(p.grad().defined() ? p.grad().to_vector()
                                   : std::vector<float>(static_cast<size_t>(p.numel()), 0.0f));
  }
  return g;
}

// The average over `ranks` of each rank's gradient, computed on a replica of ddp's model.
Grads expected_average(nn::Module& replica, const std::vector<int>& ranks, int it,
                       const Shape& shape) {
  Grads sum = zero_grads(replica);
  for (int r : ranks) {
    const Grads g = local_grads(replica, make_batch(r, it, shape));
    for (size_t i = 0; i < g.size(); ++i) {
      for (size_t k = 0; k < g[i].size(); ++k) sum[i][k] += g[i][k] / ranks.size();
    }
  }
  return sum;
}

void expect_grads_near(const nn::Module& model, const Grads& expected, const std::string& what) {
  const std::vector<Tensor> params = model.parameters();
  ASSERT_EQ(params.size(), expected.size());
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i].grad().defined()) << what << ": parameter " << i << " has no grad";
    const std::vector<float> actual = params[i].grad().to_vector();
    for (size_t k = 0; k < actual.size(); ++k) {
      EXPECT_NEAR(actual[k], expected[i][k], kTolerance)
          << what << ": parameter " << i << " element " << k;
    }
  }
}

// A replica with the state DDP broadcast (rank 0's), for computing reference gradients.
std::shared_ptr<nn::Module> replica_of(const nn::Module& model, std::shared_ptr<nn::Module> fresh) {
  fresh->load_state_dict(model.state_dict());
  return fresh;
}

std::vector<int> all_ranks(int world) {
  std::vector<int> r(world);
  for (int i = 0; i < world; ++i) r[i] = i;
  return r;
}

struct NetCase {
  const char* name;
  std::shared_ptr<nn::Module> (*make)(uint64_t);
  Shape input;
  DDPOptions options;
  int world;
};

class DDPGradientTest : public ::testing::TestWithParam<NetCase> {};

TEST_P(DDPGradientTest, GradientsEqualAverageOfRankGradients) {
  const NetCase c = GetParam();
  auto result = run_world(c.world, [&](int rank, const auto& pg) {
    auto model = c.make(static_cast<uint64_t>(rank));
    DistributedDataParallel ddp(model, pg, c.options);
    // Construction broadcast rank 0's parameters (every rank initialised differently).
    const auto rank0_params = c.make(0)->parameters();
    for (size_t i = 0; i < rank0_params.size(); ++i) {
      EXPECT_EQ(model->parameters()[i].to_vector(), rank0_params[i].to_vector()) << "param " << i;
    }
    auto replica = replica_of(*model, c.make(99));
    for (int it = 0; it < 2; ++it) {
      const Grads expected = expected_average(*replica, all_ranks(c.world), it, c.input);
      model->zero_grad();
      const Batch b = make_batch(rank, it, c.input);
      cross_entropy(ddp.forward(b.x), b.y).backward();
      expect_grads_near(*model, expected, "iteration " + std::to_string(it));
    }
  });
  EXPECT_RANKS_OK(result);
}

INSTANTIATE_TEST_SUITE_P(
    Nets, DDPGradientTest,
    ::testing::Values(
        NetCase{"Mlp", make_mlp, {4, 6}, {}, 4},
        NetCase{"MlpTinyBuckets", make_mlp, {4, 6}, kTinyBuckets, 4},
        NetCase{"MlpTinyBucketsWorld8", make_mlp, {3, 6}, kTinyBuckets, 8},
        NetCase{"MlpWorld3", make_mlp, {4, 6}, {}, 3},
        NetCase{"MlpTinyBucketsWorld5", make_mlp, {3, 6}, kTinyBuckets, 5},
        NetCase{"ConvBatchNorm", make_conv_bn, {2, 3, 5, 5}, {}, 4},
        NetCase{"ConvBatchNormTinyBucketsWorld7", make_conv_bn, {2, 3, 5, 5}, kTinyBuckets, 7},
        NetCase{"ConvBatchNormTinyBuckets", make_conv_bn, {2, 3, 5, 5}, kTinyBuckets, 4}),
    [](const auto& info) { return std::string(info.param.name); });

// a(x) on every rank, + b(x) on odd ranks only; c is never used.
class Branchy : public nn::Module {
 public:
  Branchy(bool use_b, uint64_t seed) : Module("Branchy"), use_b_(use_b) {
    Generator gen(seed);
    a_ = register_module("a", std::make_shared<nn::Linear>(6, 3, true, gen));
    b_ = register_module("b", std::make_shared<nn::Linear>(6, 3, true, gen));
    c_ = register_module("c", std::make_shared<nn::Linear>(6, 3, true, gen));
  }
  Tensor forward(const Tensor& x) override {
    Tensor out = a_->forward(x);
    return use_b_ ? out + b_->forward(x) : out;
  }
  bool use_b_;

 private:
  std::shared_ptr<nn::Linear> a_, b_, c_;
};

// Rank-dependent behaviour (which ranks use a branch, whose gradients are averaged) over even
// and odd world sizes.
class DDPWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(DDPWorldTest, UnusedParameters_ZerosAndNoHang) {
  const int world = GetParam();
  auto result = run_world(world, [&](int rank, const auto& pg) {
    auto model = std::make_shared<Branchy>(rank % 2 == 1, static_cast<uint64_t>(rank));
    DistributedDataParallel ddp(model, pg, kTinyBuckets);
    auto replica = std::make_shared<Branchy>(false, 99);
    replica->load_state_dict(model->state_dict());
    // Reference: each rank's gradient with its own branch choice, zeros where unused.
    Grads expected = zero_grads(*replica);
    for (int r = 0; r < world; ++r) {
      replica->use_b_ = r % 2 == 1;
      const Grads g = local_grads(*replica, make_batch(r, 0, {4, 6}));
      for (size_t i = 0; i < g.size(); ++i) {
        for (size_t k = 0; k < g[i].size(); ++k) expected[i][k] += g[i][k] / world;
      }
    }
    const Batch b = make_batch(rank, 0, {4, 6});
    cross_entropy(ddp.forward(b.x), b.y).backward();
    expect_grads_near(*model, expected, "unused parameters");
    // c is unused everywhere: zero gradient (4 and 5 are c.weight and c.bias).
    for (size_t i : {4u, 5u}) {
      for (float v : model->parameters()[i].grad().to_vector()) EXPECT_EQ(v, 0.0f);
    }
  });
  EXPECT_RANKS_OK(result);
}

TEST_P(DDPWorldTest, NoSync_AccumulatesLocallyThenAveragesTheSum) {
  const int world = GetParam();
  auto result = run_world(world, [&](int rank, const auto& pg) {
    auto model = make_mlp(static_cast<uint64_t>(rank));
    DistributedDataParallel ddp(model, pg, kTinyBuckets);
    auto replica = replica_of(*model, make_mlp(99));
    const Grads mine = local_grads(*replica, make_batch(rank, 0, {4, 6}));
    // Expected after both micro-batches: mean over ranks of (g(batch 0) + g(batch 1)).
    Grads expected = zero_grads(*replica);
    for (int r = 0; r < world; ++r) {
      for (int it = 0; it < 2; ++it) {
        const Grads g = local_grads(*replica, make_batch(r, it, {4, 6}));
        for (size_t i = 0; i < g.size(); ++i) {
          for (size_t k = 0; k < g[i].size(); ++k) expected[i][k] += g[i][k] / world;
        }
      }
    }
    {
      auto guard = ddp.no_sync();
      const Batch b = make_batch(rank, 0, {4, 6});
      cross_entropy(ddp.forward(b.x), b.y).backward();
    }
    expect_grads_near(*model, mine, "inside no_sync (local gradients)");
    const Batch b = make_batch(rank, 1, {4, 6});
    cross_entropy(ddp.forward(b.x), b.y).backward();
    expect_grads_near(*model, expected, "after the synchronised backward");
  });
  EXPECT_RANKS_OK(result);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DDPWorldTest, ::testing::Values(3, 4, 5),
                         [](const auto& info) { return "World" + std::to_string(info.param); });

// DDP's start: every replica ends with rank 0's values, bit for bit; the model goes on the wire
// only when the ranks hold different values. Linear(512, 512) is 262,656 floats (1 MB): a
// broadcast to 3 peers writes at least 3 MB in all, the fingerprint check a few hundred bytes.
TEST(DistributedDataParallel, Start_BroadcastsOnlyWhenTheRanksHoldDifferentValues) {
  const int world = 4;
  auto result = run_world(world, [&](int rank, const auto& world_pg) {
    const testing::CountedGroup counted = testing::counted_group(*world_pg, "counted");
    const auto make = [](uint64_t seed) {
      Generator gen(seed);
      return std::make_shared<nn::Linear>(512, 512, true, gen);
    };
    const auto values = [](const nn::Module& m) {
      std::vector<float> out;
      for (const Tensor& p : m.parameters()) {
        const std::vector<float> v = p.to_vector();
        out.insert(out.end(), v.begin(), v.end());
      }
      return out;
    };
    const std::vector<float> rank0 = values(*make(0));
    const double model_bytes = static_cast<double>(rank0.size() * sizeof(float));
    for (const bool same : {true, false}) {
      const std::string what = same ? "same values on every rank" : "values differ by rank";
      auto model = make(same ? 0 : static_cast<uint64_t>(rank));
      const uint64_t before = counted.bytes_sent();
      DistributedDataParallel ddp(model, counted.pg);
      std::vector<double> sent{static_cast<double>(counted.bytes_sent() - before)};
      // Bit for bit: float equality of every value (no NaN here) and the same sign of zeros.
      const std::vector<float> after = values(*model);
      ASSERT_EQ(after.size(), rank0.size());
      for (size_t i = 0; i < after.size(); ++i) {
        ASSERT_EQ(std::signbit(after[i]), std::signbit(rank0[i])) << what << ", value " << i;
        ASSERT_EQ(after[i], rank0[i]) << what << ", value " << i;
      }
      world_pg->allreduce(std::span<double>(sent), comm::ReduceOp::kSum)->wait();
      if (same) {
        EXPECT_LT(sent[0], 16.0 * 1024) << what << ": bytes all ranks sent while DDP started";
      } else {
        EXPECT_GE(sent[0], 3 * model_bytes) << what << ": bytes all ranks sent while DDP started";
      }
    }
  });
  EXPECT_RANKS_OK(result);
}

// Records, from inside the hook, which buckets launched and whether backward was still running.
struct OverlapProbe {
  std::shared_ptr<comm::ProcessGroup> pg;
  Tensor first_layer_weight;  // its gradient is computed last in backward
  std::vector<int64_t> launched;
  std::vector<bool> is_last;
  bool first_layer_pending_at_bucket0 = false;
};

TEST(DistributedDataParallel, Overlap_FirstBucketLaunchesBeforeBackwardFinishes) {
  const int world = 4;
  auto result = run_world(world, [&](int rank, const auto& pg) {
    auto model = make_mlp(static_cast<uint64_t>(rank));
    DistributedDataParallel ddp(model, pg, kTinyBuckets);
    const size_t buckets = ddp.bucket_assignment().size();
    // Reverse registration order; the first bucket closes once it reaches 0.0002 MB (210 B):
    // fc3.bias 12 B + fc3.weight 144 B + fc2.bias 48 B + fc2.weight 768 B. The rest fits in one.
    ASSERT_EQ(buckets, 2u);
    EXPECT_EQ(ddp.bucket_assignment()[0], (std::vector<size_t>{5, 4, 3, 2}));
    EXPECT_EQ(ddp.bucket_assignment()[1], (std::vector<size_t>{1, 0}));
    auto probe = std::make_shared<OverlapProbe>();
    probe->pg = pg;
    probe->first_layer_weight = model->parameters()[0];
    ddp.register_comm_hook(probe, [](OverlapProbe& s, GradBucket& bucket) {
      s.launched.push_back(bucket.index());
      s.is_last.push_back(bucket.is_last());
      if (bucket.index() == 0)
        s.first_layer_pending_at_bucket0 = !s.first_layer_weight.grad().defined();
      return allreduce_hook(*s.pg, bucket);
    });
    auto replica = replica_of(*model, make_mlp(99));
    const Grads expected = expected_average(*replica, all_ranks(world), 0, {4, 6});
    const Batch b = make_batch(rank, 0, {4, 6});
    cross_entropy(ddp.forward(b.x), b.y).backward();
    EXPECT_TRUE(probe->first_layer_pending_at_bucket0)
        << "bucket 0 was launched only after the first layer's gradient existed";
    ASSERT_EQ(probe->launched.size(), buckets);
    for (size_t i = 0; i < buckets; ++i) {
      EXPECT_EQ(probe->launched[i], static_cast<int64_t>(i));
      EXPECT_EQ(probe->is_last[i], i + 1 == buckets) << "bucket " << i;
    }
    expect_grads_near(*model, expected, "with the probe hook");
    // The hook cannot change once a backward ran.
    EXPECT_THROW(ddp.register_comm_hook(pg, allreduce_hook), InvalidArgument);
  });
  EXPECT_RANKS_OK(result);
}

// Gradients averaged over the whole world for 2 iterations, then within each rank's node (the
// hook's default subgroup), and not at all without the post-local allreduce. node_of(rank): the
// members of the rank's node.
void expect_global_then_intra_node(int world, const hsgd::testing::WorldOptions& options,
                                   const std::function<std::vector<int>(int)>& node_of) {
  auto result = run_world(world, options, [&](int rank, const auto& pg) {
    const std::vector<int> node = node_of(rank);
    auto model = make_mlp(static_cast<uint64_t>(rank));
    DistributedDataParallel ddp(model, pg, kTinyBuckets);
    auto state = std::make_shared<PostLocalSGDState>(
        PostLocalSGDState{.process_group = pg, .start_localSGD_iter = 2});
    ddp.register_comm_hook(state, post_localSGD_hook);
    ASSERT_NE(state->subgroup, nullptr) << "the intra-node group is created at registration";
    EXPECT_EQ(state->subgroup->ranks(), node);

    auto local_model = make_mlp(static_cast<uint64_t>(rank));
    DistributedDataParallel local_ddp(local_model, pg, kTinyBuckets);
    auto local_state = std::make_shared<PostLocalSGDState>(PostLocalSGDState{
        .process_group = pg, .start_localSGD_iter = 2, .post_local_gradient_allreduce = false});
    local_ddp.register_comm_hook(local_state, post_localSGD_hook);

    auto replica = replica_of(*model, make_mlp(99));
    for (int it = 0; it < 4; ++it) {
      const bool global = it < 2;
      const Grads expected =
          expected_average(*replica, global ? all_ranks(world) : node, it, {4, 6});
      const Batch b = make_batch(rank, it, {4, 6});
      model->zero_grad();
      cross_entropy(ddp.forward(b.x), b.y).backward();
      expect_grads_near(*model, expected, "iteration " + std::to_string(it));

      const Grads expected_local =
          global ? expected : expected_average(*replica, {rank}, it, {4, 6});
      local_model->zero_grad();
      cross_entropy(local_ddp.forward(b.x), b.y).backward();
      expect_grads_near(*local_model, expected_local,
                        "no post-local allreduce, iteration " + std::to_string(it));
    }
    EXPECT_EQ(state->iter, 2);
  });
  EXPECT_RANKS_OK(result);
}

// (world size, ranks per "node"): pairs; one rank per node in an odd world (after the start
// every rank is alone); nodes of three.
class PostLocalSGDHookTest : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(PostLocalSGDHookTest, GlobalThenIntraNode) {
  const auto [world, per_node] = GetParam();
  // Nodes of per_node contiguous ranks.
  expect_global_then_intra_node(world, {.local_world_size = per_node}, [per_node](int rank) {
    std::vector<int> node(static_cast<size_t>(per_node));
    for (int i = 0; i < per_node; ++i)
      node[static_cast<size_t>(i)] = rank / per_node * per_node + i;
    return node;
  });
}

// Nodes running different numbers of ranks (hsgd-run --nproc-per-node 3 on
// one node, 1 on another): after the start each rank averages within its node's members.
class PostLocalSGDHookUnevenTest : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(PostLocalSGDHookUnevenTest, GlobalThenWithinEachNode) {
  const std::vector<int> sizes = GetParam();
  std::vector<std::vector<int>> members;  // of each rank's node
  for (size_t n = 0, first = 0; n < sizes.size(); first += static_cast<size_t>(sizes[n]), ++n) {
    std::vector<int> node;
    for (int i = 0; i < sizes[n]; ++i) node.push_back(static_cast<int>(first) + i);
    for (int i = 0; i < sizes[n]; ++i) members.push_back(node);
  }
  expect_global_then_intra_node(
      static_cast<int>(members.size()), {.node_sizes = sizes},
      [&members](int rank) { return members[static_cast<size_t>(rank)]; });
}

INSTANTIATE_TEST_SUITE_P(Layouts, PostLocalSGDHookUnevenTest,
                         ::testing::Values(std::vector<int>{3, 1}, std::vector<int>{2, 1, 1}),
                         [](const auto& info) { return testing::node_layout_name(info.param); });

INSTANTIATE_TEST_SUITE_P(Nodes, PostLocalSGDHookTest,
                         ::testing::Values(std::pair{4, 2}, std::pair{5, 1}, std::pair{6, 3}),
                         [](const auto& info) {
                           return "World" + std::to_string(info.param.first) + "PerNode" +
                                  std::to_string(info.param.second);
                         });

TEST(DistributedDataParallel, InvalidArguments_NameTheValue) {
  auto result = run_world(1, [&](int, const auto& pg) {
    EXPECT_THROW(DistributedDataParallel(nullptr, pg), InvalidArgument);
    EXPECT_THROW(DistributedDataParallel(make_mlp(0), nullptr), InvalidArgument);
    try {
      DistributedDataParallel ddp(make_mlp(0), pg, {.bucket_cap_mb = -1});
      ADD_FAILURE() << "no exception for bucket_cap_mb -1";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("bucket_cap_mb must be > 0, got -1"), std::string::npos)
          << e.what();
    }
    DistributedDataParallel ddp(make_mlp(0), pg);
    auto state = std::make_shared<PostLocalSGDState>();  // no process_group
    EXPECT_THROW(ddp.register_comm_hook(state, post_localSGD_hook), InvalidArgument);
  });
  EXPECT_RANKS_OK(result);
}

}  // namespace
}  // namespace hsgd::distributed
