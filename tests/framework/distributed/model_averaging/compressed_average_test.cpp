// CompressedAverage (compressed_average.h): float32 within a node, 16-bit between the node
// leaders with rounding at each step of the ring, error feedback on the leaders. Every rank's
// result and residual must equal, bit for bit, the reference that follows the stated rule
// (reference_averager.h), at 2, 3 and 4 ranks on 1 to 4 emulated nodes (uneven ones, declared
// as hsgd-run does, included); and the bytes between nodes must be about half of float32's.

#include "framework/distributed/model_averaging/compressed_average.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "framework/distributed/model_averaging/averagers.h"
#include "framework/distributed/model_averaging/compression.h"
#include "tests/framework/distributed/model_averaging/reference_averager.h"
#include "tests/support/world.h"

namespace hsgd::distributed {
namespace {

using hsgd::testing::run_world;
using Values = std::vector<float>;

// Rank r's payload at round t: values no 16-bit format holds, different per rank, round and
// element, of both signs and several magnitudes.
Values payload(int rank, int round, size_t n) {
  Values p(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = std::sin(0.37f * static_cast<float>(i + 1) + 1.3f * static_cast<float>(rank) +
                    0.11f * static_cast<float>(round)) *
           std::pow(2.0f, static_cast<float>(static_cast<int>(i % 7) - 3));
  }
  return p;
}

struct Layout {
  int world;
  std::vector<int> node_sizes;  // contiguous emulated nodes
  bool uneven;  // declared as uneven nodes (node ranks), else as LOCAL_WORLD_SIZE alone
};

class CompressedAverageTest : public ::testing::TestWithParam<Layout> {};

TEST_P(CompressedAverageTest, MatchesReferenceBitForBit) {
  const Layout& layout = GetParam();
  const int world = layout.world;
  const std::vector<int>& node_sizes = layout.node_sizes;
  // 16-bit formats: chunks of uneven size, the last one short; block formats: chunks of several
  // blocks, the last block of each chunk short.
  constexpr size_t kN16 = 37, kNBlocks = 2 * kQuantBlock * 3 + 41;
  hsgd::testing::WorldOptions options;
  if (layout.uneven) {
    options.node_sizes = node_sizes;
  } else {
    options.local_world_size = node_sizes[0];
  }
  auto result = run_world(world, options, [&](int rank, const auto& pg) {
    struct Case {
      Compression compression;
      float scale;
      bool error_feedback;
    };
    for (const Case& c :
         {Case{Compression::kBF16, 1.0f, false}, Case{Compression::kBF16, 1.0f, true},
          Case{Compression::kFP16, 512.0f, true}, Case{Compression::kInt8, 1.0f, false},
          Case{Compression::kInt8, 1.0f, true}, Case{Compression::kInt4, 1.0f, true}}) {
      const bool block = c.compression == Compression::kInt8 || c.compression == Compression::kInt4;
      const size_t kN = block ? kNBlocks : kN16;
      const std::string what = std::string(to_string(c.compression)) +
                               (c.error_feedback ? " with error feedback" : "") + ", rank " +
                               std::to_string(rank);
      detail::CompressedAverage average(pg, c.compression, c.scale);
      std::vector<Values> residuals(static_cast<size_t>(world), Values(kN, 0.0f));
      Values residual(c.error_feedback ? kN : 0, 0.0f);
      for (int round = 0; round < 3; ++round) {
        std::vector<Values> payloads;
        for (int r = 0; r < world; ++r) payloads.push_back(payload(r, round, kN));
        const Values expected = testing::reference_compressed_mean(
            payloads, 0, node_sizes, c.compression, c.scale, c.error_feedback, residuals);
        Values buffer = payloads[static_cast<size_t>(rank)];
        const int64_t bytes = average.start(buffer, residual);
        average.wait();
        for (size_t i = 0; i < kN; ++i) {
          ASSERT_EQ(buffer[i], expected[i]) << what << " round " << round << " element " << i;
          if (c.error_feedback) {
            ASSERT_EQ(residual[i], residuals[static_cast<size_t>(rank)][i])
                << what << " residual, round " << round << " element " << i;
          }
        }
        const int nodes = average.nodes();
        ASSERT_EQ(nodes, static_cast<int>(node_sizes.size())) << what;
        const int64_t chunk_words =
            packed_words(c.compression, static_cast<int64_t>((kN + nodes - 1) / nodes));
        EXPECT_EQ(bytes, average.leader() && nodes > 1 ? 2 * (nodes - 1) * chunk_words * 8 : 0)
            << what;
      }
      // The rounding was real: some residual is non-zero on a leader between nodes.
      if (c.error_feedback && average.leader() && average.nodes() > 1) {
        bool any = false;
        for (float e : residual) any |= e != 0.0f;
        EXPECT_TRUE(any) << what;
      }
    }
  });
  EXPECT_RANKS_OK(result);
}

INSTANTIATE_TEST_SUITE_P(Layouts, CompressedAverageTest,
                         ::testing::Values(Layout{2, {1, 1}, false}, Layout{2, {2}, false},
                                           Layout{3, {1, 1, 1}, false}, Layout{3, {2, 1}, true},
                                           Layout{3, {1, 2}, true}, Layout{4, {1, 1, 1, 1}, false},
                                           Layout{4, {2, 2}, false}, Layout{4, {3, 1}, true},
                                           Layout{4, {1, 2, 1}, true}),
                         [](const auto& info) {
                           std::string name = "World" + std::to_string(info.param.world) + "Nodes";
                           for (int size : info.param.node_sizes) name += std::to_string(size);
                           return name;
                         });

// 4 ranks on 2 nodes: a bf16 level sends at most 0.55x the bytes of the same level in float32,
// int8 at most 0.28x, int4 at most 1/7
// (the first averaging of each is float32 and sets the anchor, so it is left out).
TEST(CompressedAverageBytes, FourRanksTwoNodes_AtMostHalfOfFloat32) {
  auto result = run_world(4, {.local_world_size = 2}, [&](int rank, const auto& pg) {
    constexpr int64_t kN = 1000;
    const auto run = [&](Compression compression) {
      PeriodicModelAverager averager(
          LevelOptions{.period = 1, .outer = OuterOptimizer{.lr = 1.0}, .compression = compression},
          0, pg);
      Tensor p = from_vector(payload(rank, 0, kN), {kN}).set_requires_grad(true);
      p.set_grad(ones({kN}));
      averager.average_parameters(std::vector<Tensor>{p});
      const int64_t first = averager.level_stats()[0].bytes;
      for (int t = 0; t < 4; ++t) averager.average_parameters(std::vector<Tensor>{p});
      return averager.level_stats()[0].bytes - first;
    };
    const int64_t fp32 = run(Compression::kNone), bf16 = run(Compression::kBF16);
    EXPECT_EQ(fp32, 4 * kN * 4);
    // The leaders (ranks 0 and 2) send 2 chunks of 500 values, 125 words each; the others
    // nothing between the nodes.
    EXPECT_EQ(bf16, rank % 2 == 0 ? 4 * 2 * 125 * 8 : 0);
    EXPECT_LE(static_cast<double>(bf16), 0.55 * static_cast<double>(fp32));
    // Over the group too (the float32 path counts every rank's payload).
    // int8 and int4: chunks of 500 values are a block of 256 and one of 244, each with a step
    // word: 1 + 32 + 1 + 31 words (int8), 1 + 16 + 1 + 16 (int4).
    const int64_t int8 = run(Compression::kInt8), int4 = run(Compression::kInt4);
    EXPECT_EQ(int8, rank % 2 == 0 ? 4 * 2 * 65 * 8 : 0);
    EXPECT_EQ(int4, rank % 2 == 0 ? 4 * 2 * 34 * 8 : 0);
    std::vector<double> totals{static_cast<double>(fp32), static_cast<double>(bf16),
                               static_cast<double>(int8), static_cast<double>(int4)};
    pg->allreduce(std::span<double>(totals))->wait();
    EXPECT_LE(totals[1], 0.55 * totals[0]);
    EXPECT_LE(totals[2], 0.28 * totals[0]);
    EXPECT_LE(totals[3], 1.0 / 7 * totals[0]);
  });
  EXPECT_RANKS_OK(result);
}

}  // namespace
}  // namespace hsgd::distributed
