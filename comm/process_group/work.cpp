#include "comm/process_group/work.h"

#include "comm/error.h"

namespace hsgd::comm {

Work::Work(std::string description, Helper helper)
    : description_(std::move(description)), helper_(std::move(helper)) {}

Work::~Work() = default;

void Work::wait(Duration timeout) {
  if (helper_ && !is_completed()) helper_(*this, timeout);
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_.wait_for(lock, timeout, [&] { return completed_; })) {
    HSGD_THROW(Timeout, "Work::wait: ", description_, " did not complete within ", timeout.count(),
               " ms");
  }
  if (error_) std::rethrow_exception(error_);
}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_;
}

bool Work::is_success() const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ && !error_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

std::chrono::steady_clock::time_point Work::finished_at() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_at_;
}

void Work::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    completed_ = true;
    finished_at_ = std::chrono::steady_clock::now();
    error_ = std::move(error);
  }
  done_.notify_all();
}

}  // namespace hsgd::comm
