// DataLoader across a change of the world in the middle of an epoch: repartition() and
// state_dict()/load_state_dict() continue at the global position, so the ranks of all the
// partitions of an epoch take every sample once, plus the padding of the last partition.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/data/data_loader.h"
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

constexpr int64_t kBatch = 4;
constexpr int64_t kEpoch = 1;

DataLoaderOptions options(int rank, int world, int64_t prefetch) {
  return {.batch_size = kBatch,
          .shuffle = true,
          .seed = 11,
          .rank = rank,
          .world_size = world,
          .prefetch = prefetch};
}

// The epoch's order P.
std::vector<int64_t> epoch_order(int64_t n) {
  DataLoader whole(counting(n), options(0, 1, 0));
  whole.set_epoch(kEpoch);
  return whole.indices();
}

// The examples of the next `batches` batches of a new pass (all of them when batches < 0).
std::vector<int64_t> take(const DataLoader& loader, int64_t batches) {
  std::vector<int64_t> out;
  if (batches == 0) return out;  // begin() would hand out batch 0
  int64_t taken = 0;
  for (const Batch& b : loader) {
    for (float v : b.inputs.to_vector()) out.push_back(static_cast<int64_t>(v));
    if (++taken == batches) break;
  }
  return out;
}

// Checks that every loader is on the partition (offset, its rank, world) of P.
void expect_partition(const std::vector<DataLoader*>& loaders, const std::vector<int64_t>& order,
                      int64_t offset, const std::string& what) {
  const auto world = static_cast<int64_t>(loaders.size());
  const int64_t remaining = static_cast<int64_t>(order.size()) - offset;
  const int64_t per_rank = (remaining + world - 1) / world;
  for (int64_t r = 0; r < world; ++r) {
    const DataLoader& loader = *loaders[static_cast<size_t>(r)];
    ASSERT_EQ(loader.options().rank, r) << what;
    ASSERT_EQ(loader.options().world_size, world) << what;
    EXPECT_EQ(loader.offset(), offset) << what << " rank " << r;
    EXPECT_EQ(loader.position(), 0) << what << " rank " << r;
    EXPECT_EQ(loader.num_batches(), (per_rank + kBatch - 1) / kBatch) << what << " rank " << r;
    ASSERT_EQ(static_cast<int64_t>(loader.indices().size()), per_rank) << what << " rank " << r;
    for (int64_t k = 0; k < per_rank; ++k) {
      EXPECT_EQ(loader.indices()[static_cast<size_t>(k)],
                order[static_cast<size_t>(offset + (k * world + r) % remaining)])
          << what << " rank " << r << " k " << k;
    }
  }
}

// Every sample of P once, plus the documented padding of the last partition (offset, world):
// the first ceil(R / W) * W - R samples of its remainder P[offset:], cycling.
void expect_exact_cover(const std::vector<int64_t>& taken, const std::vector<int64_t>& order,
                        int64_t offset, int64_t world, const std::string& what) {
  std::map<int64_t, int> expected, got;
  for (int64_t i : order) ++expected[i];
  const int64_t remaining = static_cast<int64_t>(order.size()) - offset;
  const int64_t padding = (remaining + world - 1) / world * world - remaining;
  for (int64_t j = 0; j < padding; ++j)
    ++expected[order[static_cast<size_t>(offset + j % remaining)]];
  for (int64_t i : taken) ++got[i];
  for (const auto& [index, count] : expected) {
    EXPECT_EQ(got[index], count) << what << ": times example " << index << " was taken";
  }
  for (const auto& [index, count] : got) {
    EXPECT_TRUE(expected.count(index) == 1) << what << ": example " << index << " not in P";
  }
}

struct Case {
  int64_t n;
  int64_t prefetch;
};
const std::vector<Case> kCases = {{73, 0}, {75, 2}, {101, 0}, {101, 2}, {160, 1}};

std::string name(const Case& c) {
  return "n " + std::to_string(c.n) + " prefetch " + std::to_string(c.prefetch);
}

// 4 ranks take 3 batches each; loaders 3, 1, 0 become ranks 0, 1, 2 of 3 and take 2 batches
// each; the loaders of ranks 2 and 0 become ranks 0, 1 of 2 and finish the epoch.
TEST(DataLoaderRepartitionTest, Repartition_4To3To2_TakesEverySampleOncePlusLastPadding) {
  for (const Case& c : kCases) {
    const std::vector<int64_t> order = epoch_order(c.n);
    std::vector<std::unique_ptr<DataLoader>> four;
    std::vector<int64_t> taken;
    for (int r = 0; r < 4; ++r) {
      four.push_back(std::make_unique<DataLoader>(counting(c.n), options(r, 4, c.prefetch)));
      four.back()->set_epoch(kEpoch);
      for (int64_t i : take(*four.back(), 3)) taken.push_back(i);
      EXPECT_EQ(four.back()->position(), 3) << name(c);
    }

    std::vector<DataLoader*> three = {four[3].get(), four[1].get(), four[0].get()};
    for (int r = 0; r < 3; ++r) three[static_cast<size_t>(r)]->repartition(r, 3);
    expect_partition(three, order, 3 * kBatch * 4, name(c) + ", world 3");
    for (DataLoader* loader : three) {
      for (int64_t i : take(*loader, 2)) taken.push_back(i);
      EXPECT_EQ(loader->position(), 2) << name(c);
    }

    std::vector<DataLoader*> two = {three[2], three[0]};
    for (int r = 0; r < 2; ++r) two[static_cast<size_t>(r)]->repartition(r, 2);
    const int64_t last_offset = 3 * kBatch * 4 + 2 * kBatch * 3;
    expect_partition(two, order, last_offset, name(c) + ", world 2");
    for (DataLoader* loader : two) {
      for (int64_t i : take(*loader, -1)) taken.push_back(i);
      EXPECT_EQ(loader->position(), loader->num_batches()) << name(c);
    }
    expect_exact_cover(taken, order, last_offset, 2, name(c));
  }
}

// The same world changes through the state: one rank's state_dict() is given to every rank of
// the next world, which loads it into a loader built with its own rank and world size.
TEST(DataLoaderRepartitionTest, LoadStateDict_OnAnotherWorld_ContinuesAtTheGlobalPosition) {
  for (const Case& c : kCases) {
    const std::vector<int64_t> order = epoch_order(c.n);
    std::vector<int64_t> taken;
    // Builds world loaders that load `state` (none: a new epoch) and take `batches` each.
    auto run = [&](int world, const StateDict* state, int64_t batches, int64_t offset) {
      std::vector<std::unique_ptr<DataLoader>> loaders;
      std::vector<DataLoader*> views;
      for (int r = 0; r < world; ++r) {
        loaders.push_back(
            std::make_unique<DataLoader>(counting(c.n), options(r, world, c.prefetch)));
        if (state != nullptr) loaders.back()->load_state_dict(*state);
        // The usual loop selects the epoch first: the restored partition survives it.
        loaders.back()->set_epoch(kEpoch);
        views.push_back(loaders.back().get());
      }
      expect_partition(views, order, offset, name(c) + ", world " + std::to_string(world));
      for (DataLoader* loader : views) {
        for (int64_t i : take(*loader, batches)) taken.push_back(i);
      }
      return loaders;
    };
    const auto four = run(4, nullptr, 3, 0);
    const StateDict from_four = four[2]->state_dict();
    EXPECT_FALSE(from_four.contains("offset")) << name(c);
    const auto three = run(3, &from_four, 2, 3 * kBatch * 4);
    const StateDict from_three = three[1]->state_dict();
    const int64_t last_offset = 3 * kBatch * 4 + 2 * kBatch * 3;
    EXPECT_EQ(from_three.get_int("offset"), 3 * kBatch * 4) << name(c);
    EXPECT_EQ(from_three.get_int("position"), 2) << name(c);
    run(2, &from_three, -1, last_offset);
    expect_exact_cover(taken, order, last_offset, 2, name(c));
  }
}

// With the saved world size the saved offset and position are restored as they are.
TEST(DataLoaderRepartitionTest, LoadStateDict_OnTheSameWorld_RestoresOffsetAndPosition) {
  DataLoader saver(counting(101), options(1, 4, 0));
  saver.set_epoch(kEpoch);
  take(saver, 2);
  saver.repartition(0, 3);
  take(saver, 1);
  const StateDict state = saver.state_dict();
  DataLoader loaded(counting(101), options(2, 3, 2));
  loaded.load_state_dict(state);
  EXPECT_EQ(loaded.position(), 1);
  loaded.set_epoch(kEpoch);  // keeps the restored partition and position
  EXPECT_EQ(loaded.offset(), 2 * kBatch * 4);
  DataLoader reference(counting(101), options(0, 4, 0));
  reference.set_epoch(kEpoch);
  reference.repartition(2, 3);  // at position 0: offset 0 on world 3
  EXPECT_EQ(reference.offset(), 0);
  const std::vector<int64_t> order = epoch_order(101);
  const int64_t offset = 2 * kBatch * 4, remaining = 101 - offset;
  std::vector<int64_t> expected;
  for (int64_t k = kBatch; k < (remaining + 2) / 3; ++k) {
    expected.push_back(order[static_cast<size_t>(offset + (k * 3 + 2) % remaining)]);
  }
  EXPECT_EQ(take(loaded, -1), expected);
}

// A state without "offset" (every state of a loader that never repartitioned) loads on the
// same world size as the full partition at the saved position, and a loader that never
// repartitioned saves exactly the five keys.
TEST(DataLoaderRepartitionTest, StateWithoutOffset_LoadsTheFullPartitionAtThePosition) {
  StateDict old;
  old.set("epoch", kEpoch);
  old.set("position", int64_t{3});
  old.set("batch_size", kBatch);
  old.set("world_size", int64_t{3});
  old.set("dataset_size", int64_t{50});
  DataLoader loaded(counting(50), options(1, 3, 0));
  loaded.load_state_dict(old);
  EXPECT_EQ(loaded.position(), 3);
  loaded.set_epoch(kEpoch);
  EXPECT_EQ(loaded.offset(), 0);
  DataLoader fresh(counting(50), options(1, 3, 0));
  fresh.set_epoch(kEpoch);
  EXPECT_EQ(loaded.indices(), fresh.indices());
  const std::vector<int64_t> all = take(fresh, -1);
  EXPECT_EQ(take(loaded, -1), std::vector<int64_t>(all.begin() + 3 * kBatch, all.end()));

  const StateDict saved = fresh.state_dict();
  std::vector<std::string> keys;
  for (const auto& [key, value] : saved.entries()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"epoch", "position", "batch_size", "world_size",
                                            "dataset_size"}));
  EXPECT_EQ(saved.get_int("position"), fresh.num_batches());
}

// A state saved when its partition was finished (short or padded last batch) leaves nothing of
// the epoch on another world size.
TEST(DataLoaderRepartitionTest, FinishedPartition_LeavesNothingOnAnotherWorld) {
  for (bool drop_last : {false, true}) {
    DataLoaderOptions o = options(0, 3, 0);
    o.drop_last = drop_last;
    DataLoader saver(counting(50), o);  // 17 samples per rank: 5 batches, the last of 1
    saver.set_epoch(kEpoch);
    take(saver, -1);
    o.rank = 1;
    o.world_size = 2;
    DataLoader loaded(counting(50), o);
    loaded.load_state_dict(saver.state_dict());
    EXPECT_EQ(loaded.offset(), 50) << "drop_last " << drop_last;
    EXPECT_EQ(loaded.num_batches(), 0) << "drop_last " << drop_last;
    EXPECT_TRUE(loaded.indices().empty()) << "drop_last " << drop_last;
    EXPECT_TRUE(loaded.begin() == loaded.end()) << "drop_last " << drop_last;
  }
}

// set_epoch of the next epoch returns to the full partition with the current rank and world
// size; set_epoch of the current epoch keeps the partition.
TEST(DataLoaderRepartitionTest, SetEpoch_NextEpochIsTheFullPartition_SameEpochKeepsIt) {
  DataLoader loader(counting(101), options(3, 4, 2));
  loader.set_epoch(kEpoch);
  take(loader, 3);
  loader.repartition(1, 3);
  const std::vector<int64_t> repartitioned = loader.indices();
  loader.set_epoch(kEpoch);
  EXPECT_EQ(loader.offset(), 3 * kBatch * 4);
  EXPECT_EQ(loader.indices(), repartitioned);

  loader.set_epoch(kEpoch + 1);
  DataLoader fresh(counting(101), options(1, 3, 0));
  fresh.set_epoch(kEpoch + 1);
  EXPECT_EQ(loader.offset(), 0);
  EXPECT_EQ(loader.position(), 0);
  EXPECT_EQ(loader.num_batches(), fresh.num_batches());
  EXPECT_EQ(loader.indices(), fresh.indices());
  EXPECT_EQ(take(loader, -1), take(fresh, -1));
  EXPECT_FALSE(loader.state_dict().contains("offset"));
}

TEST(DataLoaderRepartitionTest, InvalidArguments_AreRejectedAndChangeNothing) {
  DataLoader loader(counting(50), options(0, 2, 0));
  loader.set_epoch(kEpoch);
  take(loader, 2);
  EXPECT_THROW(loader.repartition(3, 3), InvalidArgument);
  EXPECT_THROW(loader.repartition(0, 0), InvalidArgument);
  EXPECT_EQ(loader.options().world_size, 2);
  EXPECT_EQ(loader.position(), 2);
  EXPECT_EQ(loader.offset(), 0);

  StateDict bad = loader.state_dict();
  bad.set("offset", int64_t{51});
  EXPECT_THROW(loader.load_state_dict(bad), InvalidArgument);
  bad.set("offset", int64_t{40});  // 10 samples on 2 ranks: 2 batches
  bad.set("position", int64_t{3});
  EXPECT_THROW(loader.load_state_dict(bad), InvalidArgument);
  EXPECT_EQ(loader.position(), 2);
  EXPECT_EQ(loader.offset(), 0);
  bad.set("position", int64_t{2});
  loader.load_state_dict(bad);
  EXPECT_EQ(loader.offset(), 40);
  EXPECT_EQ(loader.position(), 2);
  EXPECT_TRUE(loader.begin() == loader.end());
}

}  // namespace
}  // namespace hsgd::data
