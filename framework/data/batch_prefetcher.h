#pragma once
// BatchPrefetcher: loads batches start, start + 1, ..., end - 1 of one pass in order on a
// background thread, keeping up to `depth` loaded batches ready (DataLoader's `prefetch`, like
// torch's prefetch_factor), so loading overlaps the consumer's training step.
//
// Protocol (one producer thread, one consumer):
//   1. the worker loads batch i (load(i), outside the lock) while fewer than `depth` batches are
//      ready, then appends it; when `depth` are ready it waits until the consumer takes one or
//      the prefetcher stops;
//   2. next() waits until the batch it expects is ready and hands it out (in index order);
//   3. when load(i) throws, the worker stores the exception and stops: next() hands out the
//      batches before i, then rethrows the exception (same type and message) for batch i and
//      for every later call;
//   4. the destructor sets the stop flag, wakes the worker and joins it. A load() in progress
//      finishes first (it is never interrupted), so destruction waits at most for one batch.
// Nothing waits forever: next() waits at most `timeout` for a batch and then throws
// hsgd::Timeout naming the batch; the worker's wait ends with the destructor.
//
// load is called on the worker thread only, in index order; it must not touch state the
// consumer changes meanwhile (DataLoader gives it a copy of the epoch's indices).
//
// Usage:
//   BatchPrefetcher prefetcher([](int64_t i) { return Batch{zeros({2, 3}), {i, i}}; },
//                              /*start=*/0, /*end=*/10, /*depth=*/2, std::chrono::seconds(60));
//   while (prefetcher.next_index() < 10) Batch b = prefetcher.next();

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "framework/data/dataset.h"

namespace hsgd::data {

class BatchPrefetcher {
 public:
  using LoadFn = std::function<Batch(int64_t index)>;

  // Starts the worker at once. InvalidArgument when depth < 1, start > end or timeout <= 0.
  BatchPrefetcher(LoadFn load, int64_t start, int64_t end, int64_t depth,
                  std::chrono::milliseconds timeout);
  // Stops and joins the worker (see 4. above).
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // The index the next call of next() returns.
  int64_t next_index() const { return next_; }
  // Batch next_index(), waiting for it (see 2. and 3. above). InvalidArgument past the end;
  // hsgd::Timeout when it is not ready after `timeout`.
  Batch next();

 private:
  // The worker: loads batches index, index + 1, ... (see 1. and 3. above).
  void run(int64_t index);

  // Constant after construction.
  const LoadFn load_;
  const int64_t end_;
  const int64_t depth_;
  const std::chrono::milliseconds timeout_;

  // Consumer only.
  int64_t next_;

  // Guarded by mu_.
  std::mutex mu_;
  std::condition_variable changed_;  // a batch was appended or taken, an error, or stop
  std::deque<Batch> ready_;          // batches next_, next_ + 1, ... in order
  std::exception_ptr error_;         // what load() threw; set once
  int64_t error_index_ = -1;         // the batch whose load threw
  bool stop_ = false;

  std::thread worker_;  // last: starts after everything it uses is initialised
};

}  // namespace hsgd::data
