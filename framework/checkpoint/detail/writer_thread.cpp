#include "framework/checkpoint/detail/writer_thread.h"

#include <utility>

namespace hsgd::checkpoint::detail {

WriterThread::~WriterThread() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void WriterThread::submit(std::function<void()> job) {
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = std::move(job);
    busy_ = true;
  }
  cv_.notify_all();
}

std::exception_ptr WriterThread::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !busy_; });
  return std::exchange(error_, nullptr);
}

void WriterThread::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || job_ != nullptr; });
    if (job_ == nullptr) return;  // stop_, and nothing left to run
    std::function<void()> job = std::exchange(job_, nullptr);
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    job = nullptr;  // the captures (a snapshot's memory) go back outside the lock
    lock.lock();
    error_ = error;
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace hsgd::checkpoint::detail
