#pragma once
// DataLoader: iterates over a Dataset in batches, optionally in a seeded shuffled order and
// optionally over one shard of it for distributed training.
//
// Order of an epoch: 0..N-1, or with shuffle a permutation drawn from Generator(seed + epoch),
// so every rank that uses the same seed and epoch sees the same permutation (as
// torch.utils.data.DistributedSampler). With world_size > 1 the order is padded by repeating
// its first indices up to a multiple of world_size, and rank r takes positions r, r + W, r + 2W,
// ...: every rank gets ceil(N / W) samples and the same number of batches (DistributedSampler
// with drop_last=False). drop_last drops this rank's last batch when it is short.
//
// Call set_epoch(e) at the start of each epoch to get a new shuffle; without it every pass
// repeats epoch 0's order (as with DistributedSampler).
//
// Usage:
//   data::DataLoader loader(dataset, {.batch_size = 64, .shuffle = true, .seed = 1,
//                                     .rank = world->rank(), .world_size = world->size(),
//                                     .prefetch = 2});   // load 2 batches ahead
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.set_epoch(epoch);
//     for (const data::Batch& batch : loader) {
//       Tensor loss = nn::cross_entropy(model->forward(batch.inputs), batch.targets);
//     }
//   }
//
// Position and resume: position() counts the batches of the current epoch handed out so far
// (the iterator's batch i counts as handed out once it is dereferenceable). state_dict() saves
// the epoch and position; after load_state_dict() the next pass over the loader starts at the
// saved position, also when the usual loop first calls set_epoch() with the restored epoch (a
// restored position survives set_epoch of the same epoch, and is used by the next begin()
// only). Save after training on a batch: a batch handed out but not trained is skipped.
//
// With options.transform set, every batch passes through transform(batch, indices, epoch()) after
// Dataset::get_batch (augmentation keyed by example and epoch, so a resume reproduces it).
//
// Prefetch (options.prefetch = P > 0, like torch's prefetch_factor): each pass started by
// begin() loads its batches on one background thread (batch_prefetcher.h), up to P ahead of the
// consumer, while the consumer trains. The batches and their order are exactly those without
// prefetch, and position()/state_dict() count only batches handed out by the iterator, never
// those loaded ahead. An exception thrown while loading batch i (by the data set or the
// transform) is rethrown, with its type and message, when the iterator reaches batch i. A new
// begin(), set_epoch(), load_state_dict() or the destructor stops the thread and joins it (a
// batch being loaded is finished first). Waiting for a batch longer than options.timeout throws
// hsgd::Timeout. With prefetch on, Dataset::get_batch and the transform run on that thread (one
// call at a time, in batch order): they must not share unguarded state with the consumer (the
// bundled data sets and transforms do not). batch(i) always loads synchronously.
//
// Errors: batch_size < 1, world_size < 1, rank outside [0, world_size), prefetch < 0,
// timeout <= 0, null dataset: InvalidArgument naming the value.
//
// Not thread-safe: one thread iterates, calls set_epoch and saves or loads the state.

#include <chrono>
#include <cstdint>
#include <iterator>
#include <memory>
#include <vector>

#include "framework/data/batch_prefetcher.h"
#include "framework/data/dataset.h"
#include "framework/data/transforms.h"
#include "framework/train/state_dict.h"

namespace hsgd::data {

struct DataLoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = false;
  uint64_t seed = 0;
  bool drop_last = false;
  int rank = 0;
  int world_size = 1;
  // Applied to every batch with its data set indices and the current epoch (e.g. RandomCropFlip,
  // see transforms.h); empty: none.
  BatchTransform transform = {};
  // Batches loaded ahead on a background thread (see above); 0: every batch is loaded when the
  // iterator reaches it, on the consumer's thread.
  int64_t prefetch = 0;
  // With prefetch: how long the iterator waits for a batch before throwing hsgd::Timeout.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  // Stops the prefetch thread, if any, and joins it.
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Selects the order of the following passes (see above).
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }

  // This rank's dataset indices for the current epoch, in order.
  const std::vector<int64_t>& indices() const { return indices_; }
  int64_t num_batches() const;
  // Batch i of the current epoch, i in [0, num_batches()), loaded now on this thread.
  Batch batch(int64_t i) const;

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = const Batch*;
    using reference = const Batch&;

    Iterator(const DataLoader* loader, int64_t index);
    const Batch& operator*() const { return current_; }
    const Batch* operator->() const { return &current_; }
    Iterator& operator++();
    bool operator==(const Iterator& other) const { return index_ == other.index_; }

   private:
    void load();
    const DataLoader* loader_;
    int64_t index_;
    Batch current_;
  };
  // The first pass after load_state_dict starts at the restored position, every other at 0.
  Iterator begin() const;
  Iterator end() const { return Iterator(this, num_batches()); }

  // Batches of the current epoch handed out so far (see above).
  int64_t position() const { return position_; }

  // For checkpoints: "epoch", "position", "batch_size", "world_size", "dataset_size" (int64).
  StateDict state_dict() const;
  // Restores the epoch and the position of the next pass. When the state was saved with another
  // world size (a resume on a different number of ranks), the position is recomputed from the
  // global number of samples seen in the epoch: floor(position * batch_size * saved_world /
  // (batch_size * world_size)). InvalidArgument (nothing changed) when batch_size or the data
  // set size differ from this loader's, or the position is outside [0, num_batches].
  void load_state_dict(const StateDict& state);

  const DataLoaderOptions& options() const { return options_; }
  const Dataset& dataset() const { return *dataset_; }

 private:
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  int64_t epoch_ = 0;
  std::vector<int64_t> indices_;
  // Batch i for the iterator: from the prefetcher when it has batch i next, else loaded now.
  Batch fetch(int64_t i) const;
  void stop_prefetch() const { prefetcher_.reset(); }

  // Iteration bookkeeping, written by const iteration (begin(), the iterator).
  mutable int64_t position_ = 0;
  mutable int64_t resume_at_ = 0;  // where the next begin() starts; 0 after it did
  mutable std::unique_ptr<BatchPrefetcher> prefetcher_;  // the pass begin() started, if prefetching
};

}  // namespace hsgd::data
