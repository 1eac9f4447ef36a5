#pragma once
// CollectiveQueue: the FIFO of one ProcessGroup's collectives and the worker thread that runs
// them (comm-internal; ProcessGroup is the interface).
//
// Tasks run one at a time and in the order queued, whichever thread runs them: the worker, or the
// calling thread in two cases that save the two thread hand-offs (to the worker and back) of a
// caller that waits at once:
// - run_or_enqueue(): when no task is queued or running, the task runs on the calling thread
//   before the call returns (its Work is then complete);
// - help(), called by Work::wait: when the worker is idle and the waiter allows at least the
//   group's timeout, the waiter runs the queued tasks itself.
// Each task gets a sequence number, which with its fingerprint (collective_fingerprint.h) makes
// its Gloo tag and its description ("allreduce (1000 x float, sum) #7 'DDP bucket 0'"). The
// watchdog, hsgd-run's progress slot and the failure rules below see a task the same way on
// every thread.
//
// Failures: a task that throws hsgd::InvalidArgument sent nothing, so only its Work fails. Any
// other exception breaks the queue (Gloo's connections may hold half a message): on_failure
// turns it into the error of that Work, and every later task fails at once with
// hsgd::CommError quoting the first failure.
//
// Usage (inside ProcessGroup; not compiled: uses its private members):
//   queue_ = std::make_unique<CollectiveQueue>(name, timeout, on_failure);
//   auto work = queue_->enqueue({.kind = "barrier"}, [&](uint32_t tag) { ... }, helper);
//   auto done = queue_->run_or_enqueue({.kind = "barrier"}, [&](uint32_t tag) { ... }, helper);

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/process_group/detail/collective_fingerprint.h"
#include "comm/process_group/detail/collective_watchdog.h"
#include "comm/process_group/work.h"
#include "comm/store/store.h"

namespace hsgd::detail {

class CollectiveQueue {
 public:
  using Run = std::function<void(uint32_t tag)>;
  // Turns the failure e of the task with fingerprint fp (seq set) into the error that breaks
  // the queue; the group uses it to say what every rank was doing. Runs on the task's thread.
  using OnFailure =
      std::function<std::exception_ptr(const CollectiveFingerprint& fp, const std::exception& e)>;

  // group_name names the group in messages; timeout is the group's deadline for one collective
  // (a wait shorter than that never runs a task inline). watchdog, if not null, is told when
  // each task begins and ends (collective_watchdog.h) and must outlive the queue. Starts the
  // worker thread.
  CollectiveQueue(std::string group_name, comm::Duration timeout, OnFailure on_failure,
                  CollectiveWatchdog* watchdog = nullptr);
  // Runs the tasks still queued (each bounded by its own deadline), then joins the worker.
  ~CollectiveQueue();
  CollectiveQueue(const CollectiveQueue&) = delete;
  CollectiveQueue& operator=(const CollectiveQueue&) = delete;

  // Sets fp.seq, queues run (called with gloo_tag(seq, fp.shape_hash())) and returns its Work,
  // described as "<fp.describe()> of group '<name>'"; helper is the Work's wait helper (the
  // group passes one that keeps the group alive and calls help()). After close(), returns a
  // Work that already failed with hsgd::CommError.
  std::shared_ptr<comm::Work> enqueue(CollectiveFingerprint fp, Run run, comm::Work::Helper helper);

  // For a caller that waits at once. When no task is queued or running, numbers fp like
  // enqueue and runs the task on the calling thread (watchdog, progress slot, failure rules as
  // on the worker), then returns its completed Work: the call blocks for as long as the
  // collective takes (up to the group's deadline, plus the failure report's own wait when it
  // fails). Otherwise (another task is queued or running on any thread) it is queued exactly
  // like enqueue and the call returns at once. Never busy-waits.
  std::shared_ptr<comm::Work> run_or_enqueue(CollectiveFingerprint fp, Run run,
                                             comm::Work::Helper helper);

  // The sequence number the next queued task gets.
  uint64_t next_seq() const;

  // Refuses the tasks queued from now on (ProcessGroup::shutdown); queued ones still run.
  void close();

  // Work::wait's helper: runs queued tasks on the waiting thread until work completed, unless
  // another thread is running one (then the waiter simply blocks).
  void help(const comm::Work& work, comm::Duration timeout);

  // Whether a task failed (the queue is broken: later tasks fail at once). Any thread.
  bool broken() const { return broken_flag_.load(); }

 private:
  struct Task {
    std::shared_ptr<comm::Work> work;
    CollectiveFingerprint fp;  // with its seq
    std::string what;          // fp.describe(): "allreduce (1000 x float, sum) #7"
    Run run;
  };

  // Under mu_: a Work that already failed because the queue is closed (fp gets the number it
  // would have had, not consumed).
  std::shared_ptr<comm::Work> refused(CollectiveFingerprint& fp) const;
  // Under mu_: numbers fp and builds its task.
  Task make_task(CollectiveFingerprint fp, Run run, comm::Work::Helper helper);
  void worker_loop();
  // Pops the task at the head of the queue and runs it, holding exec_mu_ throughout, so tasks
  // run one at a time and in order whichever thread runs them. False if the queue was empty.
  bool run_next();
  void run_task(Task& task);

  // Constant after construction.
  const std::string group_name_;
  const comm::Duration timeout_;
  const OnFailure on_failure_;
  CollectiveWatchdog* const watchdog_;

  // Guarded by exec_mu_ (used by whichever thread runs a task).
  std::exception_ptr broken_;  // first failure; later tasks fail fast
  std::string broken_what_;
  std::atomic<bool> broken_flag_{false};  // broken_ is set; read by any thread

  std::mutex exec_mu_;  // held while a task is popped (or numbered, when run directly) and run
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Task> queue_;  // guarded by mu_
  uint64_t next_seq_ = 0;   // guarded by mu_
  bool stopping_ = false;   // guarded by mu_
  bool closed_ = false;     // guarded by mu_
  std::thread worker_;      // started last in the constructor
};

}  // namespace hsgd::detail
