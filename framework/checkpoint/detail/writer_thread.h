#pragma once
// Internal to Checkpointer: the thread that writes a checkpoint while training goes on. One
// thread for the Checkpointer's life, started by the first submit(): starting a thread per save
// cost 30 us to a few ms of the training stall on a busy machine (checkpoint_bench). It runs one
// job at a time; the owner collects each job with wait() before it submits the next.
//
// Usage:
//   detail::WriterThread writer;
//   writer.submit([] {
//     // ... encode and write the files ...
//   });
//   // ... train ...
//   std::exception_ptr error = writer.wait();  // the job's exception, or null

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace hsgd::checkpoint::detail {

class WriterThread {
 public:
  WriterThread() = default;
  // Runs the job still queued (if any), then ends the thread.
  ~WriterThread();
  WriterThread(const WriterThread&) = delete;
  WriterThread& operator=(const WriterThread&) = delete;

  // Runs job on the thread and returns at once. The previous job must have been collected by
  // wait(). The job's captures are destroyed on the thread, outside the lock, once it ran.
  void submit(std::function<void()> job);
  // Blocks until the submitted job has run and returns its exception (null when it succeeded or
  // when nothing was submitted since the last wait()).
  std::exception_ptr wait();

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;  // job_ set, busy_ cleared, or stop_ set
  std::function<void()> job_;   // guarded by mu_: the job to run, or empty
  bool busy_ = false;           // guarded by mu_: a job is queued or running
  bool stop_ = false;           // guarded by mu_: the destructor ends the thread
  std::exception_ptr error_;    // guarded by mu_: the last job's exception
  std::thread thread_;          // last: started after the members it uses
};

}  // namespace hsgd::checkpoint::detail
