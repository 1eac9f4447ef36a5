#include "framework/data/batch_prefetcher.h"

#include <string>
#include <utility>

#include "comm/error.h"

namespace hsgd::data {

BatchPrefetcher::BatchPrefetcher(LoadFn load, int64_t start, int64_t end, int64_t depth,
                                 std::chrono::milliseconds timeout)
    : load_(std::move(load)), end_(end), depth_(depth), timeout_(timeout), next_(start) {
  HSGD_CHECK(load_ != nullptr, "BatchPrefetcher: load function is empty");
  HSGD_CHECK(depth_ >= 1, "BatchPrefetcher: depth ", depth_, " must be at least 1");
  HSGD_CHECK(start >= 0 && start <= end_, "BatchPrefetcher: start ", start, " must be in [0, ",
             end_, "]");
  HSGD_CHECK(timeout_.count() > 0, "BatchPrefetcher: timeout ", timeout_.count(),
             " ms must be positive");
  worker_ = std::thread([this, start] { run(start); });
}

void BatchPrefetcher::run(int64_t index) {
  while (index < end_) {
    {
      std::unique_lock lock(mu_);
      // Wait for room: at most depth_ batches loaded ahead of the consumer.
      changed_.wait(lock, [&] { return stop_ || static_cast<int64_t>(ready_.size()) < depth_; });
      if (stop_) return;
    }
    Batch batch;
    try {
      batch = load_(index);  // outside the lock: the consumer takes ready batches meanwhile
    } catch (...) {
      std::lock_guard lock(mu_);
      error_ = std::current_exception();
      error_index_ = index;
      changed_.notify_all();
      return;
    }
    std::lock_guard lock(mu_);
    if (stop_) return;
    ready_.push_back(std::move(batch));
    ++index;
    changed_.notify_all();
  }
}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

Batch BatchPrefetcher::next() {
  HSGD_CHECK(next_ < end_, "BatchPrefetcher::next: batch ", next_, " is past the end ", end_);
  std::unique_lock lock(mu_);
  const bool arrived = changed_.wait_for(lock, timeout_, [&] {
    return !ready_.empty() || (error_ != nullptr && error_index_ == next_);
  });
  if (!ready_.empty()) {
    Batch batch = std::move(ready_.front());
    ready_.pop_front();
    ++next_;
    changed_.notify_all();  // room for the worker
    return batch;
  }
  if (arrived) std::rethrow_exception(error_);  // load(next_) threw
  throw Timeout("DataLoader: batch " + std::to_string(next_) + " was not loaded after " +
                std::to_string(timeout_.count()) +
                " ms (the prefetch worker is still loading it; DataLoaderOptions::timeout)");
}

}  // namespace hsgd::data
