#pragma once
// ProbeDataset: a data set for the prefetch tests whose example i is the single value i (target
// i % 3), that counts get_batch calls, can throw on one example, and can hold get_batch for one
// example until released, so a test can see and steer what a background loader does.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/error.h"
#include "framework/data/dataset.h"
#include "framework/tensor/tensor.h"

namespace hsgd::data::testing {

class ProbeDataset : public Dataset {
 public:
  explicit ProbeDataset(int64_t n) : n_(n) {}

  int64_t size() const override { return n_; }
  Shape example_shape() const override { return {1}; }
  Batch get_batch(const std::vector<int64_t>& indices) const override {
    calls_.fetch_add(1);
    std::vector<float> values;
    Batch batch;
    for (int64_t i : indices) {
      if (i == throw_at_) throw InvalidArgument("ProbeDataset: example " + std::to_string(i));
      if (i == hold_at_) {
        std::unique_lock lock(mu_);
        held_ = true;
        cv_.notify_all();
        cv_.wait(lock, [&] { return released_; });
      }
      values.push_back(static_cast<float>(i));
      batch.targets.push_back(i % 3);
    }
    batch.inputs = from_vector(values, {static_cast<int64_t>(indices.size()), 1});
    return batch;
  }

  // get_batch throws InvalidArgument "ProbeDataset: example I" on example i.
  void throw_at(int64_t i) { throw_at_ = i; }
  // get_batch waits on example i until release().
  void hold_at(int64_t i) { hold_at_ = i; }
  void release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  // Whether a get_batch is waiting on the held example (waits up to 10 s for it).
  bool wait_held() const {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return held_; });
  }
  int64_t calls() const { return calls_.load(); }
  // Waits up to 10 s until calls() == n, then 50 ms more, and returns calls() (to see that the
  // loader stopped there).
  int64_t settle_at(int64_t n) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (calls() < n && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return calls();
  }

 private:
  const int64_t n_;
  int64_t throw_at_ = -1;
  int64_t hold_at_ = -1;
  mutable std::atomic<int64_t> calls_{0};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable bool held_ = false;
  bool released_ = false;
};

}  // namespace hsgd::data::testing
