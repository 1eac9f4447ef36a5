#include "apps/common/preemption.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <span>
#include <thread>

#include "comm/error.h"
#include "comm/log.h"

namespace hsgd::apps {
namespace {

// Process-wide by nature: signal dispositions are. Written by the watching thread and the
// training loop only.
std::atomic<int> g_armed{0};
std::atomic<int> g_signal{0};

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
  if (g_armed.load() > 0) {
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

PreemptionCheck::PreemptionCheck(std::shared_ptr<comm::ProcessGroup> world, bool armed)
    : world_(std::move(world)), armed_(armed) {
  HSGD_CHECK(world_ != nullptr, "PreemptionCheck: world must not be null");
  if (armed_) g_armed.fetch_add(1);
}

PreemptionCheck::~PreemptionCheck() {
  if (armed_) g_armed.fetch_sub(1);
  try {
    finish();
  } catch (const std::exception& e) {
    comm::logger()->warn("PreemptionCheck: the last preemption flag allreduce failed: {}",
                         e.what());
  }
}

bool PreemptionCheck::stop_now() {
  if (!armed_) return false;
  if (world_->size() == 1) return g_signal.load() != 0;
  bool stop = false;
  if (pending_) {
    pending_->wait();
    pending_.reset();
    stop = flag_ > 0;
  }
  if (stop) return true;
  flag_ = g_signal.load() != 0 ? 1.0 : 0.0;
  pending_ = world_->allreduce(std::span<double>(&flag_, 1), comm::ReduceOp::kMax, "preemption");
  return false;
}

void PreemptionCheck::finish() {
  if (!pending_) return;
  auto work = std::move(pending_);
  pending_.reset();
  work->wait();
}

}  // namespace hsgd::apps
