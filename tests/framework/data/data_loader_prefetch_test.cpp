// DataLoader with options.prefetch > 0: the same batches as without, a position that counts only
// batches handed out, the worker's errors at the consumer, and a thread that always ends.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/data/data_loader.h"
#include "framework/data/transforms.h"
#include "tests/framework/data/probe_dataset.h"

namespace hsgd::data {
namespace {

using testing::ProbeDataset;

// One pass: every batch's input values and targets, in order.
struct Pass {
  std::vector<std::vector<float>> inputs;
  std::vector<std::vector<int64_t>> targets;
};

Pass pass(const DataLoader& loader) {
  Pass out;
  for (const Batch& b : loader) {
    out.inputs.push_back(b.inputs.to_vector());
    out.targets.push_back(b.targets);
  }
  return out;
}

void expect_same(const Pass& expected, const Pass& got, const std::string& what) {
  ASSERT_EQ(expected.inputs.size(), got.inputs.size()) << what << ": number of batches";
  for (size_t i = 0; i < expected.inputs.size(); ++i) {
    EXPECT_EQ(expected.inputs[i], got.inputs[i]) << what << ": inputs of batch " << i;
    EXPECT_EQ(expected.targets[i], got.targets[i]) << what << ": targets of batch " << i;
  }
}

// A transform that depends on the example and the epoch, as augmentation does.
void shift_by_epoch(Batch& batch, const std::vector<int64_t>& indices, int64_t epoch) {
  std::vector<float> v = batch.inputs.to_vector();
  for (size_t k = 0; k < v.size(); ++k) v[k] += 1000.0f * static_cast<float>(epoch) + 0.5f;
  batch.inputs = from_vector(v, batch.inputs.shape());
  batch.targets.push_back(static_cast<int64_t>(indices.size()));
}

TEST(DataLoaderPrefetchTest, SameBatchesInTheSameOrder_AsWithoutPrefetch) {
  for (int64_t prefetch : {1, 2, 5}) {
    for (int world : {1, 3}) {
      for (bool drop_last : {false, true}) {
        DataLoaderOptions options{.batch_size = 4,
                                  .shuffle = true,
                                  .seed = 7,
                                  .drop_last = drop_last,
                                  .rank = world - 1,
                                  .world_size = world,
                                  .transform = shift_by_epoch};
        DataLoader plain(std::make_shared<ProbeDataset>(37), options);
        options.prefetch = prefetch;
        DataLoader ahead(std::make_shared<ProbeDataset>(37), options);
        for (int64_t epoch = 0; epoch < 3; ++epoch) {
          plain.set_epoch(epoch);
          ahead.set_epoch(epoch);
          const std::string what = "prefetch " + std::to_string(prefetch) + " world " +
                                   std::to_string(world) + " drop_last " +
                                   std::to_string(drop_last) + " epoch " + std::to_string(epoch);
          const Pass expected = pass(plain);
          ASSERT_GT(expected.inputs.size(), 2u) << what;
          expect_same(expected, pass(ahead), what);
          expect_same(expected, pass(ahead), what + ", second pass");
        }
      }
    }
  }
}

TEST(DataLoaderPrefetchTest, StateDict_CountsOnlyBatchesHandedOut_AndResumesExactly) {
  auto data = std::make_shared<ProbeDataset>(60);
  const DataLoaderOptions options{.batch_size = 5, .shuffle = true, .seed = 3, .prefetch = 4};
  DataLoader loader(data, options);
  loader.set_epoch(2);
  Pass consumed;
  StateDict saved;
  int64_t handed_out = 0;
  for (const Batch& b : loader) {
    consumed.inputs.push_back(b.inputs.to_vector());
    consumed.targets.push_back(b.targets);
    if (++handed_out == 3) {
      // The worker has loaded 4 batches beyond the 3 handed out; they are not consumed.
      EXPECT_EQ(data->settle_at(3 + 4), 3 + 4);
      EXPECT_EQ(loader.position(), 3);
      saved = loader.state_dict();
      break;
    }
  }
  EXPECT_EQ(saved.get_int("position"), 3);
  EXPECT_EQ(saved.get_int("epoch"), 2);

  // Resume in a new loader (with prefetch): the rest of epoch 2, exactly.
  DataLoader reference(std::make_shared<ProbeDataset>(60),
                       {.batch_size = 5, .shuffle = true, .seed = 3});
  reference.set_epoch(2);
  const Pass whole = pass(reference);
  DataLoader resumed(std::make_shared<ProbeDataset>(60), options);
  resumed.load_state_dict(saved);
  resumed.set_epoch(2);  // as the usual loop does
  const Pass rest = pass(resumed);
  Pass joined = consumed;
  joined.inputs.insert(joined.inputs.end(), rest.inputs.begin(), rest.inputs.end());
  joined.targets.insert(joined.targets.end(), rest.targets.begin(), rest.targets.end());
  expect_same(whole, joined, "3 batches, then the resumed rest");
  EXPECT_EQ(resumed.position(), resumed.num_batches());
}

TEST(DataLoaderPrefetchTest, DatasetError_IsRethrownAtItsBatch_WithItsMessage) {
  for (int64_t prefetch : {0, 3}) {
    auto data = std::make_shared<ProbeDataset>(40);
    data->throw_at(17);  // in batch 4 of 10 (batch_size 4, no shuffle)
    DataLoader loader(data, {.batch_size = 4, .prefetch = prefetch});
    int64_t batches = 0;
    std::string message;
    try {
      for (const Batch& b : loader) {
        EXPECT_EQ(b.inputs.to_vector()[0], static_cast<float>(4 * batches));
        ++batches;
      }
    } catch (const InvalidArgument& e) {
      message = e.what();
    }
    EXPECT_EQ(message, "ProbeDataset: example 17") << "prefetch " << prefetch;
    EXPECT_EQ(batches, 4) << "prefetch " << prefetch;
    EXPECT_EQ(loader.position(), 4) << "prefetch " << prefetch << ": batch 4 was not handed out";
  }
}

TEST(DataLoaderPrefetchTest, DestroyedMidEpoch_JoinsTheWorker) {
  auto data = std::make_shared<ProbeDataset>(1000);
  {
    DataLoader loader(data, {.batch_size = 2, .prefetch = 2});
    auto it = loader.begin();
    ++it;
    EXPECT_EQ(data->settle_at(4), 4);  // 2 handed out, 2 ahead: the worker waits for room
  }                                    // joins the waiting worker
  EXPECT_EQ(data->settle_at(4), 4) << "the worker kept loading after the loader was destroyed";

  // And while the worker is inside get_batch: the destructor waits for that batch.
  auto held = std::make_shared<ProbeDataset>(1000);
  held->hold_at(4);  // batch 2, loaded once batch 0 is taken
  {
    DataLoader loader(held, {.batch_size = 2, .prefetch = 2});
    auto it = loader.begin();
    EXPECT_EQ(it->inputs.to_vector()[0], 0.0f);
    ASSERT_TRUE(held->wait_held());
    held->release();
  }
  EXPECT_EQ(held->settle_at(3), 3);  // batches 0, 1, 2; nothing after the destructor
}

TEST(DataLoaderPrefetchTest, BreakAndNewPass_OrSetEpoch_RestartTheWorkerCorrectly) {
  auto data = std::make_shared<ProbeDataset>(30);
  DataLoader plain(std::make_shared<ProbeDataset>(30),
                   {.batch_size = 4, .shuffle = true, .seed = 1});
  DataLoader loader(data, {.batch_size = 4, .shuffle = true, .seed = 1, .prefetch = 2});
  for (const Batch& b : loader) {
    (void)b;
    break;  // leaves a running worker behind
  }
  expect_same(pass(plain), pass(loader), "a new pass after a break starts at batch 0");
  auto it = loader.begin();
  ++it;
  loader.set_epoch(1);  // mid-pass: the worker of epoch 0 stops
  plain.set_epoch(1);
  expect_same(pass(plain), pass(loader), "epoch 1 after set_epoch mid-pass");
}

TEST(DataLoaderPrefetchTest, SlowBatch_ThrowsTimeout_AndInvalidOptionsAreRejected) {
  auto data = std::make_shared<ProbeDataset>(20);
  data->hold_at(4);  // batch 1
  {
    DataLoader loader(data,
                      {.batch_size = 4, .prefetch = 1, .timeout = std::chrono::milliseconds(50)});
    auto it = loader.begin();
    try {
      ++it;
      FAIL() << "batch 1 was handed out although its load is held";
    } catch (const Timeout& e) {
      EXPECT_NE(std::string(e.what()).find("batch 1 was not loaded after 50 ms"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(loader.position(), 1);
    data->release();
  }
  EXPECT_THROW(DataLoader(data, {.prefetch = -1}), InvalidArgument);
  EXPECT_THROW(DataLoader(data, {.timeout = std::chrono::milliseconds(0)}), InvalidArgument);
}

}  // namespace
}  // namespace hsgd::data
