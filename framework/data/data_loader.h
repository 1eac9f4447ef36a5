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
// Position and resume: position() counts the batches of the current partition handed out so far
// (the iterator's batch i counts as handed out once it is dereferenceable). state_dict() saves
// the epoch and position; after load_state_dict() the next pass over the loader starts at the
// saved position, also when the usual loop first calls set_epoch() with the restored epoch (a
// restored position survives set_epoch of the same epoch, and is used by the next begin()
// only). Save after training on a batch: a batch handed out but not trained is skipped.
//
// Repartition (the world changes mid-epoch): with P the epoch's order and N its length, a
// partition is a global offset O (0 at set_epoch of a new epoch) and the current rank r and world
// size W. Its remainder P[O:] (R = N - O samples) is padded by cycling through it from its start,
// P[O], P[O+1], ..., up to a multiple of W, and rank r takes remainder positions r, r + W, ...:
// indices() is P[O + ((k * W + r) mod R)] for k in [0, ceil(R / W)), every rank has the same
// number of batches, and O = 0 is the partition described above. The padding repeats the
// first ceil(R / W) * W - R samples of the remainder (each once when that is <= R); no other
// sample is taken twice in a partition. When every rank of a partition has taken b batches,
// b < num_batches(), all of them full, exactly P[0 : O + b * batch_size * W] is consumed: that
// is the global position G. When b = num_batches() the partition is finished: G = N (with
// drop_last, the samples of the dropped short batches stay unseen in this epoch).
//  - repartition(rank, world_size) moves this loader to the partition (G, rank, world_size) of
//    the same epoch, G computed from offset(), position() and the old world size. Every rank of
//    the new world must call it (or load_state_dict, below) at the same G, i.e. after the same
//    number of batches of the old partition: then the ranks of all the partitions of an epoch
//    together take every sample of P exactly once, plus the padding of the partition they
//    finish.
//  - state_dict() holds "offset" = O when O > 0. load_state_dict() on a loader whose world size
//    differs from the saved one moves it to the partition (G, its own rank, its own world
//    size), G computed from the saved offset, position and world size: so the state of any one
//    rank of a world, loaded by every rank of the next world with its own rank, continues the
//    epoch exactly. With the saved world size it restores the saved offset and position (a
//    state without "offset" has offset 0: the full partition at the saved position). The
//    computation of G is exact for every state a loader with the same options produces, so no
//    case falls back to an estimate.
//  - set_epoch() with another epoch returns to offset 0 (the full partition of that epoch with
//    the current rank and world size); set_epoch() of the current epoch keeps the partition and
//    restarts it (or keeps a restored position, as above).
// Call repartition() after training on the batch last handed out (as for state_dict(), a batch
// handed out but not trained is skipped). Iterators of a pass started before repartition() or
// load_state_dict() are invalid after it.
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
// begin(), set_epoch(), repartition(), load_state_dict() or the destructor stops the thread and
// joins it (a batch being loaded is finished first). Waiting for a batch longer than
// options.timeout throws hsgd::Timeout. With prefetch on, Dataset::get_batch and the transform run
// on that thread (one call at a time, in batch order): they must not share unguarded state with the
// consumer (the bundled data sets and transforms do not). batch(i) always loads synchronously.
//
// Errors: batch_size < 1, world_size < 1, rank outside [0, world_size), prefetch < 0,
// timeout <= 0, null dataset (also rank and world size given to repartition()): InvalidArgument
// naming the value.
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

  // Moves to the partition of the rest of the current epoch over a new world (see above):
  // offset() becomes the global position G, position() 0, options() holds the new rank and world
  // size. InvalidArgument (nothing changed) when world_size < 1 or rank is outside
  // [0, world_size). Stops the prefetch thread; the next begin() starts the new partition.
  void repartition(int rank, int world_size);
  // Samples of the epoch's order consumed before the current partition (see above).
  int64_t offset() const { return offset_; }

  // This rank's dataset indices of the current partition, in order.
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

  // Batches of the current partition handed out so far (see above).
  int64_t position() const { return position_; }

  // For checkpoints: "epoch", "position", "batch_size", "world_size", "dataset_size", and
  // "offset" when offset() > 0 (int64).
  StateDict state_dict() const;
  // Restores the epoch and the partition and position of the next pass (see above: with the
  // saved world size the saved offset and position, with another one the partition at the saved
  // global position). The options other than rank and world size must be those of the saving
  // loader; InvalidArgument (nothing changed) when batch_size or the data set size differ from
  // this loader's, or the offset is outside [0, dataset_size], or the position is outside
  // [0, the saved partition's number of batches].
  void load_state_dict(const StateDict& state);

  const DataLoaderOptions& options() const { return options_; }
  const Dataset& dataset() const { return *dataset_; }

 private:
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  int64_t epoch_ = 0;
  int64_t offset_ = 0;  // O of the current partition
  std::vector<int64_t> indices_;
  // Rebuilds indices_ for epoch_, offset_ and the rank and world size in options_.
  void partition();
  // Number of batches of a partition of remaining samples over world ranks.
  int64_t batches_of(int64_t remaining, int64_t world) const;
  // The global position G after position batches of the partition (offset, world).
  int64_t global_position(int64_t offset, int64_t position, int64_t world) const;
  // Batch i for the iterator: from the prefetcher when it has batch i next, else loaded now.
  Batch fetch(int64_t i) const;
  void stop_prefetch() const { prefetcher_.reset(); }

  // Iteration bookkeeping, written by const iteration (begin(), the iterator).
  mutable int64_t position_ = 0;
  mutable int64_t resume_at_ = 0;  // where the next begin() starts; 0 after it did
  mutable std::unique_ptr<BatchPrefetcher> prefetcher_;  // the pass begin() started, if prefetching
};

}  // namespace hsgd::data
