#include "framework/runtime/preemption.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <span>
#include <thread>

#include "comm/error.h"
#include "comm/log.h"

namespace hsgd::runtime {
namespace {

// Process-wide by nature: signal dispositions are. Written by the watching thread and the
// training loop only.
std::atomic<int> g_armed{0};
std::atomic<int> g_signal{0};
// Set once a check decided to stop: the process is on its way to exit 75 and stays armed.
std::atomic<bool> g_stopping{false};

sigset_t preemption_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGTERM);
  return set;
}

// What either path does with a signal: record it when armed (async-signal-safe: lock-free atomics
// and write(2)), else end the process by the default action.
void take_signal(int sig) {
  if (g_armed.load() > 0 || g_stopping.load()) {
    int none = 0;
    if (g_signal.compare_exchange_strong(none, sig)) {
      const char* text = sig == SIGUSR1
                             ? "received SIGUSR1: stopping after a checkpoint at a step boundary\n"
                             : "received SIGTERM: stopping after a checkpoint at a step boundary\n";
      (void)!::write(STDERR_FILENO, text, std::strlen(text));
    }
    return;
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  ::raise(sig);  // delivered when a handler returns, at once in the watching thread
}

// Threads started before main (OpenBLAS starts its pool when the library loads) do not block
// the signals: one delivered there runs this handler.
void on_signal(int sig) { take_signal(sig); }

[[noreturn]] void watch_signals() {
  const sigset_t set = preemption_set();
  while (true) {
    int sig = 0;
    if (sigwait(&set, &sig) == 0) take_signal(sig);
  }
}

}  // namespace

void install_preemption_signals() {
  static std::once_flag once;
  std::call_once(once, [] {
    const sigset_t set = preemption_set();
    struct sigaction action {};
    action.sa_handler = on_signal;
    action.sa_flags = SA_RESTART;
    action.sa_mask = set;
    for (const int sig : {SIGUSR1, SIGTERM}) ::sigaction(sig, &action, nullptr);
    const int rc = pthread_sigmask(SIG_BLOCK, &set, nullptr);
    HSGD_CHECK_AS(Error, rc == 0,
                  "install_preemption_signals: pthread_sigmask failed: ", std::strerror(rc));
    std::thread(watch_signals).detach();
  });
}

int preemption_signal() { return g_signal.load(); }

PreemptionCheck::PreemptionCheck(std::shared_ptr<comm::ProcessGroup> world, bool armed, int lag)
    : world_(std::move(world)), armed_(armed), lag_(lag) {
  HSGD_CHECK(world_ != nullptr, "PreemptionCheck: world must not be null");
  HSGD_CHECK(lag_ >= 1, "PreemptionCheck: lag ", lag_, " must be at least 1 step");
  if (armed_) g_armed.fetch_add(1);
}

PreemptionCheck::~PreemptionCheck() {
  if (armed_) g_armed.fetch_sub(1);
  if (checks_ > 0) {
    comm::logger()->debug("preemption check: {} steps, {:.1f} us per step on the training thread",
                          checks_, 1e6 * seconds_ / static_cast<double>(checks_));
  }
  try {
    finish();
  } catch (const std::exception& e) {
    comm::logger()->warn("PreemptionCheck: the last preemption flag allreduce failed: {}",
                         e.what());
  }
}

bool PreemptionCheck::stop_now() {
  if (!armed_) return false;
  if (world_->size() == 1) {
    if (g_signal.load() != 0) g_stopping.store(true);
    return g_signal.load() != 0;
  }
  const auto start = std::chrono::steady_clock::now();
  bool stop = false;
  // The flag of the boundary `lag_` boundaries back decides now; it is usually long complete.
  if (static_cast<int>(pending_.size()) == lag_) {
    Pending& oldest = pending_.front();
    oldest.work->wait();
    stop = oldest.flag > 0;
    pending_.pop_front();
  }
  if (!stop) {
    // deque keeps the address of every other element: the buffers in flight stay put.
    Pending& next = pending_.emplace_back();
    next.flag = g_signal.load() != 0 ? 1.0 : 0.0;
    next.work = world_->allreduce(std::span<double>(&next.flag, 1), comm::ReduceOp::kMax,
                                  "preemption flag");
  }
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++checks_;
  if (stop) g_stopping.store(true);
  return stop;
}

void PreemptionCheck::finish() {
  while (!pending_.empty()) {
    auto work = pending_.front().work;
    work->wait();
    pending_.pop_front();
  }
}

}  // namespace hsgd::runtime
