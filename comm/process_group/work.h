#pragma once
// Work: the handle of one collective queued on a ProcessGroup (like torch's c10d Work). The
// collective runs on the group's worker thread; the caller may compute meanwhile and then
// wait(). (With RunOn::kCaller on an idle group it ran on the calling thread, and the Work is
// complete when returned.) The buffers passed to the collective must stay alive and untouched
// until the Work has completed.
//
// Usage:
//   std::vector<float> grads(1000, 1.0f);
//   auto work = pg->allreduce(grads, hsgd::comm::ReduceOp::kAvg);
//   // ... compute while the collective runs ...
//   work->wait();   // rethrows the collective's error, if any

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>

#include "comm/store/store.h"

namespace hsgd::comm {

class Work {
 public:
  // description names the operation in errors, e.g. "allreduce #3 of group 'world'".
  // helper, if set, is called by wait(timeout) on the waiting thread before it blocks; the
  // process group uses it to run a collective the worker thread has not started yet on the
  // waiting thread itself (only when timeout is at least the group's own deadline, so wait never
  // blocks longer than asked), which saves two thread hand-offs when the caller waits at once.
  using Helper = std::function<void(const Work&, Duration timeout)>;
  explicit Work(std::string description, Helper helper = nullptr);
  virtual ~Work();
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Blocks until the collective completed. Rethrows its error (hsgd::Timeout when a peer did
  // not arrive, hsgd::CommError for other failures). Throws hsgd::Timeout if it is still
  // running after timeout; the collective itself keeps its own (group) deadline.
  void wait(Duration timeout = kDefaultTimeout);

  // True once the collective finished, successfully or not; never blocks.
  bool is_completed() const;

  // True when it completed without error.
  bool is_success() const;

  // The error of a completed collective, or nullptr.
  std::exception_ptr exception() const;

  // When the collective finished (the steady clock as finish() read it), so that a caller who
  // waits late still knows how long the transfer took; time_point{} while not completed.
  std::chrono::steady_clock::time_point finished_at() const;

  const std::string& description() const { return description_; }

  // Called once by the thread that ran the collective when it ends (error = nullptr on success).
  void finish(std::exception_ptr error);

 private:
  const std::string description_;
  const Helper helper_;

  mutable std::mutex mu_;
  std::condition_variable done_;
  bool completed_ = false;                             // guarded by mu_
  std::exception_ptr error_;                           // guarded by mu_
  std::chrono::steady_clock::time_point finished_at_;  // guarded by mu_
};

}  // namespace hsgd::comm
