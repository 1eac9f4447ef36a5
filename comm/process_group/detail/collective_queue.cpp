#include "comm/process_group/detail/collective_queue.h"

#include "comm/error.h"
#include "comm/process_group/detail/fault_injection.h"
#include "comm/process_group/worker_progress.h"

namespace hsgd::detail {

using comm::Duration;
using comm::Work;

CollectiveQueue::CollectiveQueue(std::string group_name, Duration timeout, OnFailure on_failure,
                                 CollectiveWatchdog* watchdog)
    : group_name_(std::move(group_name)),
      timeout_(timeout),
      on_failure_(std::move(on_failure)),
      watchdog_(watchdog) {
  worker_ = std::thread([this] { worker_loop(); });
}

CollectiveQueue::~CollectiveQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::shared_ptr<Work> CollectiveQueue::refused(CollectiveFingerprint& fp) const {
  fp.seq = next_seq_;
  const std::string what = fp.describe();
  auto work = std::make_shared<Work>(what + " of group '" + group_name_ + "'");
  work->finish(std::make_exception_ptr(CommError(
      str_cat(what, " of group '", group_name_, "' was not run: the group was shut down"))));
  return work;
}

CollectiveQueue::Task CollectiveQueue::make_task(CollectiveFingerprint fp, Run run,
                                                 Work::Helper helper) {
  fp.seq = next_seq_++;
  std::string what = fp.describe();
  auto work = std::make_shared<Work>(what + " of group '" + group_name_ + "'", std::move(helper));
  return Task{std::move(work), std::move(fp), std::move(what), std::move(run)};
}

std::shared_ptr<Work> CollectiveQueue::enqueue(CollectiveFingerprint fp, Run run,
                                               Work::Helper helper) {
  std::shared_ptr<Work> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return refused(fp);
    queue_.push_back(make_task(std::move(fp), std::move(run), std::move(helper)));
    work = queue_.back().work;
  }
  wake_.notify_one();
  return work;
}

std::shared_ptr<Work> CollectiveQueue::run_or_enqueue(CollectiveFingerprint fp, Run run,
                                                      Work::Helper helper) {
  // With exec_mu_ held and the queue empty, no task runs and none waits, so this one is next in
  // order; tasks queued meanwhile get later numbers and run after it (whoever runs them needs
  // exec_mu_).
  std::unique_lock<std::mutex> exec(exec_mu_, std::try_to_lock);
  if (!exec.owns_lock()) return enqueue(std::move(fp), std::move(run), std::move(helper));
  Task task;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return refused(fp);
    if (!queue_.empty()) {
      exec.unlock();
      queue_.push_back(make_task(std::move(fp), std::move(run), std::move(helper)));
      std::shared_ptr<Work> work = queue_.back().work;
      wake_.notify_one();
      return work;
    }
    task = make_task(std::move(fp), std::move(run), std::move(helper));
  }
  run_task(task);
  return task.work;
}

uint64_t CollectiveQueue::next_seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_seq_;
}

void CollectiveQueue::close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
}

void CollectiveQueue::worker_loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and every queued task ran
    }
    run_next();  // may find the queue empty: a waiting caller ran the task itself
  }
}

bool CollectiveQueue::run_next() {
  std::lock_guard<std::mutex> exec(exec_mu_);
  Task task;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.empty()) return false;
    task = std::move(queue_.front());
    queue_.pop_front();
  }
  run_task(task);
  return true;
}

void CollectiveQueue::help(const Work& work, Duration timeout) {
  // A collective may take up to the group timeout; a shorter wait must not run it inline.
  if (timeout < timeout_) return;
  while (!work.is_completed()) {
    std::unique_lock<std::mutex> exec(exec_mu_, std::try_to_lock);
    if (!exec.owns_lock()) return;  // the worker is running a task; let it
    Task task;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    run_task(task);
  }
}

void CollectiveQueue::run_task(Task& task) {
  if (broken_) {
    task.work->finish(std::make_exception_ptr(
        CommError(str_cat(task.what, " of group '", group_name_,
                          "' was not run: the group is broken since ", broken_what_, " failed"))));
    return;
  }
  // Tells the watchdog (if any) for as long as the task runs.
  struct Watched {
    CollectiveWatchdog* watchdog;
    ~Watched() {
      if (watchdog != nullptr) watchdog->end();
    }
  };
  try {
    // Seen by hsgd-run's hang detection (comm/launcher/hang_detector.h).
    comm::CollectiveProgress progress;
    if (watchdog_ != nullptr) watchdog_->begin(task.fp);
    Watched watched{watchdog_};
    maybe_kill_in_collective(task.what);
    task.run(gloo_tag(task.fp.seq, task.fp.shape_hash()));
    task.work->finish(nullptr);
    return;
  } catch (const InvalidArgument&) {
    task.work->finish(std::current_exception());  // nothing was sent: the group is intact
    return;
  } catch (const std::exception& e) {
    broken_ = on_failure_(task.fp, e);
    broken_what_ = task.what;
    broken_flag_.store(true);
    task.work->finish(broken_);
  }
}

}  // namespace hsgd::detail
