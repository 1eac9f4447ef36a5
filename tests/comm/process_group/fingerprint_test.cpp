// Collective fingerprints (comm/process_group/detail/collective_fingerprint.h): what a collective
// is, mixed into its Gloo tag, and the failure report that says what every rank of the group is
// doing when ranks call different collectives (the order broken on some ranks, a different size).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/error.h"
#include "comm/format_ranks.h"
#include "comm/process_group/detail/collective_fingerprint.h"
#include "comm/process_group/process_group.h"
#include "tests/support/error_message.h"
#include "tests/support/world.h"

namespace hsgd::comm {
namespace {

using hsgd::detail::CollectiveFingerprint;
using hsgd::detail::describe_rank_set;
using hsgd::detail::gloo_tag;
using hsgd::testing::error_message;
using hsgd::testing::run_world;
using hsgd::testing::WorldOptions;
using ::testing::HasSubstr;
using ::testing::Not;

CollectiveFingerprint broadcast_fp(uint64_t count, int root, std::string label = "") {
  return {.kind = "broadcast",
          .dtype = "float",
          .count = count,
          .args = "root " + std::to_string(root),
          .label = std::move(label)};
}

TEST(CollectiveFingerprintTest, DescribeNamesKindSizeArgsSequenceAndLabel) {
  CollectiveFingerprint fp = broadcast_fp(98, 0, "DDP buffers");
  fp.seq = 23;
  EXPECT_EQ(fp.describe(), "broadcast (98 x float, root 0) #23 'DDP buffers'");
  CollectiveFingerprint barrier{.kind = "barrier"};
  barrier.seq = 4;
  EXPECT_EQ(barrier.describe(), "barrier #4");
}

TEST(CollectiveFingerprintTest, HashCoversWhatMustMatchButNotTheLabel) {
  const uint32_t base = broadcast_fp(98, 0).shape_hash();
  EXPECT_EQ(broadcast_fp(98, 0, "any label").shape_hash(), base);
  EXPECT_NE(broadcast_fp(99, 0).shape_hash(), base);  // count
  EXPECT_NE(broadcast_fp(98, 1).shape_hash(), base);  // root
  CollectiveFingerprint doubles = broadcast_fp(98, 0);
  doubles.dtype = "double";
  EXPECT_NE(doubles.shape_hash(), base);
  CollectiveFingerprint sum{.kind = "allreduce", .dtype = "float", .count = 8, .args = "sum"};
  CollectiveFingerprint max = sum;
  max.args = "max";
  EXPECT_NE(sum.shape_hash(), max.shape_hash());
}

TEST(CollectiveFingerprintTest, TagKeepsTheSequenceAndSeparatesMismatchedShapes) {
  const uint32_t hash = broadcast_fp(98, 0).shape_hash();
  // Neighbouring collectives of one shape get different tags (the low 20 bits are seq).
  EXPECT_NE(gloo_tag(7, hash), gloo_tag(8, hash));
  EXPECT_EQ(gloo_tag(7, hash) & 0xFFFFFu, 7u);
  EXPECT_EQ(gloo_tag(7, hash), gloo_tag(7 + (uint64_t{1} << 20), hash));
  // The same sequence number with another shape: another tag (unless 12 hash bits collide).
  EXPECT_NE(gloo_tag(7, hash), gloo_tag(7, broadcast_fp(99, 0).shape_hash()));
}

TEST(CollectiveFingerprintTest, RankSetsAreCompact) {
  EXPECT_EQ(describe_rank_set({3}), "rank 3");
  EXPECT_EQ(describe_rank_set({1, 2, 3}), "ranks 1-3");
  EXPECT_EQ(describe_rank_set({0, 1, 3}), "ranks 0, 1, 3");
  EXPECT_EQ(describe_rank_set({0, 2, 5, 6, 7}), "ranks 0, 2, 5-7");
}

// A mismatched call order seen in training: one rank calls the averager while the others broadcast
// DDP's buffers. Every rank times out, and every rank's message says what each rank is doing.
TEST(CollectiveFingerprintTest, DifferentCollectives_EveryRankReportsWhatEachRankIsDoing) {
  for (const bool shm : {true, false}) {
    WorldOptions options;
    options.timeout = std::chrono::milliseconds(3000);
    options.shared_memory = shm;
    auto result = run_world(4, options, [&](int rank, const auto& pg) {
      std::vector<float> x(16, 1.0f);
      pg->allreduce(std::span<float>(x))->wait();  // #0 matches everywhere
      std::vector<float> params(272, 1.0f);
      std::vector<float> buffers(98, 1.0f);
      // A Timeout, or (over TCP, under load) the CommError of a peer that closed its side after
      // its own timeout: either way the message must say what each rank is doing.
      const std::string message = error_message<CommError>([&] {
        if (rank == 0) {
          pg->allreduce(std::span<float>(params), ReduceOp::kSum, "averager 2:4")->wait();
        } else {
          pg->broadcast(std::span<float>(buffers), 0, "DDP buffers")->wait();
        }
      });
      EXPECT_THAT(message, HasSubstr("rank 0 is in allreduce (272 x float, sum) #1 'averager 2:4'"))
          << "rank " << rank << " shm " << shm;
      EXPECT_THAT(message, HasSubstr("ranks 1-3 are in broadcast (98 x float, root 0) #1 'DDP "
                                     "buffers'"))
          << "rank " << rank << " shm " << shm;
      EXPECT_THAT(message, Not(HasSubstr("did not arrive"))) << "rank " << rank;
    });
    EXPECT_RANKS_OK(result);
  }
}

// Same kind, different sizes, over Gloo's TCP: rank 2 expects 120 floats from root 0, which
// sends 100. The tags differ, so Gloo never delivers the message into the smaller or larger
// buffer (an abort inside Gloo before); the root's send to rank 2 and rank 2's receive time out,
// and both say who is doing what. Rank 1 got its 100 floats and went on. Whichever of the two
// times out first closes the connection, so the other may fail with "connection closed" (a
// CommError) just before its own timeout: the test asks for a CommError with the same message.
TEST(CollectiveFingerprintTest, DifferentSizesOverGloo_TimeOutWithTheSizesInsteadOfAborting) {
  WorldOptions options;
  options.timeout = std::chrono::milliseconds(3000);
  options.shared_memory = false;
  auto result = run_world(3, options, [&](int rank, const auto& pg) {
    std::vector<float> x(rank == 2 ? 120 : 100, static_cast<float>(rank + 1));
    auto store = pg->store();
    if (rank == 1) {
      pg->broadcast(std::span<float>(x), 0, "weights")->wait();
      EXPECT_EQ(x[0], 1.0f);
      // Stays alive (an exited peer would be a lost connection, not a timeout) until the others
      // have checked their error.
      store->wait({"checked/0", "checked/2"}, std::chrono::seconds(30));
      return;
    }
    const std::string message =
        error_message<CommError>([&] { pg->broadcast(std::span<float>(x), 0, "weights")->wait(); });
    EXPECT_THAT(message, HasSubstr("rank 0 is in broadcast (100 x float, root 0) #0 'weights'; "
                                   "rank 2 is in broadcast (120 x float, root 0) #0 'weights'; "
                                   "ranks [1] (global [1]) did not arrive"))
        << "rank " << rank;
    EXPECT_EQ(x[0], static_cast<float>(rank + 1)) << "rank " << rank;
    store->set("checked/" + std::to_string(rank), to_bytes("1"));
  });
  EXPECT_RANKS_OK(result);
}

}  // namespace
}  // namespace hsgd::comm
