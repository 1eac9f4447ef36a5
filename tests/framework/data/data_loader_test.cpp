#include "framework/data/data_loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <set>

#include "comm/error.h"
#include "framework/data/synthetic_dataset.h"

namespace hsgd::data {
namespace {

// A data set whose example i is the single value i, so batches reveal their indices.
std::shared_ptr<InMemoryDataset> counting(int64_t n) {
  std::vector<float> values;
  std::vector<int64_t> targets;
  for (int64_t i = 0; i < n; ++i) {
    values.push_back(static_cast<float>(i));
    targets.push_back(i % 3);
  }
  return std::make_shared<InMemoryDataset>(values, targets, Shape{1});
}

std::vector<int64_t> seen(const DataLoader& loader) {
  std::vector<int64_t> out;
  for (const Batch& b : loader) {
    const std::vector<float> v = b.inputs.to_vector();
    EXPECT_EQ(b.inputs.size(0), static_cast<int64_t>(b.targets.size()));
    for (size_t i = 0; i < v.size(); ++i) {
      out.push_back(static_cast<int64_t>(v[i]));
      EXPECT_EQ(b.targets[i], out.back() % 3) << "target of example " << out.back();
    }
  }
  return out;
}

TEST(DataLoaderTest, Sequential_BatchesCoverTheDatasetInOrder) {
  DataLoader loader(counting(10), {.batch_size = 4});
  EXPECT_EQ(loader.num_batches(), 3);
  std::vector<int64_t> expected(10);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(seen(loader), expected);
  EXPECT_EQ(loader.batch(2).inputs.size(0), 2);  // the short last batch
  EXPECT_EQ(shape_str(loader.batch(0).inputs.shape()), "[4, 1]");
}

TEST(DataLoaderTest, DropLast_DropsTheShortBatch) {
  DataLoader loader(counting(10), {.batch_size = 4, .drop_last = true});
  EXPECT_EQ(loader.num_batches(), 2);
  EXPECT_EQ(seen(loader).size(), 8u);
}

TEST(DataLoaderTest, Shuffle_IsASeededPermutationThatChangesPerEpoch) {
  DataLoader a(counting(50), {.batch_size = 7, .shuffle = true, .seed = 3});
  DataLoader b(counting(50), {.batch_size = 7, .shuffle = true, .seed = 3});
  DataLoader c(counting(50), {.batch_size = 7, .shuffle = true, .seed = 4});
  const std::vector<int64_t> first = seen(a);
  EXPECT_EQ(first, seen(b));
  EXPECT_NE(first, seen(c));
  std::vector<int64_t> sorted = first;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
  EXPECT_EQ(first, seen(a));  // same epoch, same order
  a.set_epoch(1);
  EXPECT_NE(first, seen(a));
  b.set_epoch(1);
  EXPECT_EQ(seen(a), seen(b));
}

// Like DistributedSampler: shards are disjoint up to padding, equal-sized, and together cover
// the permutation; world sizes 1..8 including odd ones and sizes that do not divide.
TEST(DataLoaderTest, Distributed_ShardsPartitionTheSamePermutation) {
  for (int64_t n : {1, 10, 17, 64}) {
    for (int world = 1; world <= 8; ++world) {
      std::map<int64_t, int> count;
      std::vector<int64_t> full_order;
      {
        DataLoader whole(counting(n), {.batch_size = 5, .shuffle = true, .seed = 9});
        whole.set_epoch(2);
        full_order = whole.indices();
      }
      const int64_t per_rank = (n + world - 1) / world;
      for (int rank = 0; rank < world; ++rank) {
        DataLoader loader(
            counting(n),
            {.batch_size = 5, .shuffle = true, .seed = 9, .rank = rank, .world_size = world});
        loader.set_epoch(2);
        const std::vector<int64_t> got = seen(loader);
        ASSERT_EQ(static_cast<int64_t>(got.size()), per_rank) << "n " << n << " world " << world;
        for (size_t k = 0; k < got.size(); ++k) {
          const int64_t position = static_cast<int64_t>(k) * world + rank;
          EXPECT_EQ(got[k], full_order[static_cast<size_t>(position % n)])
              << "n " << n << " world " << world << " rank " << rank << " k " << k;
          ++count[got[k]];
        }
      }
      EXPECT_EQ(static_cast<int64_t>(count.size()), n) << "every example seen, world " << world;
      for (auto& [index, c] : count) EXPECT_LE(c, (per_rank * world + n - 1) / n) << index;
    }
  }
}

TEST(DataLoaderTest, InvalidOptions_AreRejectedWithTheValue) {
  EXPECT_THROW(DataLoader(counting(4), {.batch_size = 0}), InvalidArgument);
  EXPECT_THROW(DataLoader(counting(4), {.rank = 3, .world_size = 3}), InvalidArgument);
  EXPECT_THROW(DataLoader(nullptr, {}), InvalidArgument);
  DataLoader loader(counting(4), {.batch_size = 2});
  EXPECT_THROW(loader.batch(2), InvalidArgument);
  EXPECT_THROW(counting(4)->get_batch({4}), InvalidArgument);
}

TEST(SyntheticDatasetTest, IsDeterministicAndBalancedEnough) {
  SyntheticOptions o{.size = 400, .example_shape = {2, 3}, .num_classes = 4, .seed = 5};
  SyntheticDataset a(o), b(o);
  EXPECT_EQ(a.values(), b.values());
  EXPECT_EQ(a.targets(), b.targets());
  o.seed = 6;
  EXPECT_NE(SyntheticDataset(o).values(), a.values());
  EXPECT_EQ(a.example_shape(), (Shape{2, 3}));
  std::map<int64_t, int> per_class;
  for (int64_t t : a.targets()) ++per_class[t];
  ASSERT_EQ(per_class.size(), 4u);
  for (auto& [c, k] : per_class) EXPECT_GT(k, 50) << "class " << c;
  EXPECT_THROW(SyntheticDataset({.num_classes = 0}), InvalidArgument);
}

}  // namespace
}  // namespace hsgd::data
