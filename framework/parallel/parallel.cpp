#include "framework/parallel/parallel.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/error.h"

namespace hsgd {
namespace {

thread_local int tls_thread_index = 0;
thread_local bool tls_in_chunk = false;

// One parallel_for call: chunks [0, count) of [begin, end), each running *fn. With piece > 0
// (parallel_for_dynamic) the count threads instead claim pieces of that many indices in turn.
struct Job {
  int64_t begin = 0, end = 0, count = 0, piece = 0;
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
};

// OpenBLAS's setter when the process links OpenBLAS (looked up by name, so that another BLAS
// still links); null otherwise.
void set_blas_threads(int n) {
  using Setter = void (*)(int);
  static const Setter setter =
      reinterpret_cast<Setter>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (setter != nullptr) setter(n);
}

// The pool: threads 1..n-1 wait for a job; the caller of parallel_for is thread 0.
//
// A job is published by bumping generation_ under mu_; each worker copies it under mu_, runs its
// chunk (if the job has one for it), then decrements pending_. The caller runs chunk 0 and waits
// for pending_ to reach 0, so a job is never replaced while a worker still needs it. Workers and
// the caller wait awake for a while before sleeping (spin_until), since kernels issue jobs back
// to back.
class Pool {
 public:
  Pool(int threads, std::chrono::microseconds spin_window)
      : threads_(threads), spin_window_(spin_window) {
    for (int i = 1; i < threads_; ++i) workers_.emplace_back([this, i] { work(i); });
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      generation_.fetch_add(1);
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }

  int threads() const { return threads_; }

  // Runs the job if the pool is free; returns false (having run nothing) when another thread
  // holds it.
  bool try_run(const Job& job) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    error_ = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = job;
      next_.store(job.begin, std::memory_order_relaxed);
      pending_.store(static_cast<int>(job.count - 1), std::memory_order_relaxed);
      generation_.fetch_add(1);
    }
    wake_.notify_all();
    run_chunk(job, 0);
    // Wait for the others: awake first (chunks are usually even), then asleep.
    const auto all_done = [this] { return pending_.load(std::memory_order_acquire) == 0; };
    if (!spin_until(all_done)) {
      std::unique_lock<std::mutex> lock(mu_);
      done_.wait(lock, all_done);
    }
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  // The first phase of spin_until: about 10-40 us of pause instructions (a pause takes 10-140
  // cycles, depending on the CPU). Longer pure spins starved the thread being waited for when
  // there were more threads than free cores; the sched_yield phase after it gives way to them.
  static constexpr int kSpins = 1000;

  void run_chunk(const Job& job, int64_t i) {
    tls_thread_index = static_cast<int>(i);
    tls_in_chunk = true;
    try {
      if (job.piece > 0) {
        // Claims pieces until none is left; a thread that started late or ran slowly takes fewer.
        for (;;) {
          const int64_t lo = next_.fetch_add(job.piece, std::memory_order_relaxed);
          if (lo >= job.end) break;
          (*job.fn)(lo, std::min(lo + job.piece, job.end));
        }
      } else {
        int64_t lo = 0, hi = 0;
        detail::chunk_range(job.begin, job.end, job.count, i, lo, hi);
        (*job.fn)(lo, hi);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu_);
      if (!error_) error_ = std::current_exception();
    }
    tls_in_chunk = false;
    tls_thread_index = 0;
  }

  // Waits awake until ready() or for about spin_window_, and returns ready(): pause
  // instructions first, then sched_yield, so that a thread of another process runnable on this CPU
  // gets it. Kernels of a training step come tens to hundreds of microseconds apart (autograd's
  // bookkeeping between them), and waking a sleeping thread costs about as much on a VM, where an
  // idle vCPU halts.
  template <typename Ready>
  bool spin_until(const Ready& ready) const {
    for (int spin = 0; spin < kSpins; ++spin) {
      if (ready()) return true;
      __builtin_ia32_pause();
    }
    const auto until = std::chrono::steady_clock::now() + spin_window_;
    while (!ready()) {
      if (std::chrono::steady_clock::now() >= until) return false;
      sched_yield();
    }
    return true;
  }

  void work(int index) {
    uint64_t seen = 0;
    for (;;) {
      spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; });
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return generation_.load() != seen; });
        if (stop_) return;
        seen = generation_.load();
        job = job_;
      }
      if (index >= job.count) continue;  // this job has fewer chunks than threads
      run_chunk(job, index);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mu_);
        done_.notify_one();
      }
    }
  }

  // Constant after construction.
  const int threads_;
  const std::chrono::microseconds spin_window_;
  std::vector<std::thread> workers_;

  std::mutex busy_;  // held by the caller whose job runs
  std::mutex mu_;    // guards job_ and stop_ while they are published
  std::condition_variable wake_, done_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int64_t> next_{0};  // the first unclaimed index of a dynamic job
  bool stop_ = false;
  Job job_;
  std::mutex error_mu_;
  std::exception_ptr error_;  // the first exception of the running job
};

// The process's pool, guarded by registry_mu and replaced by set_num_threads; callers hold a
// reference while their job runs. After fork() the child leaks the parent's pool, whose threads
// do not exist in the child, and makes its own on first use.
std::mutex registry_mu;
std::shared_ptr<Pool> pool;
int requested_threads = 0;  // 0: not decided yet

void forget_pool_in_child() {
  new std::shared_ptr<Pool>(std::move(pool));  // leaked on purpose: never joins absent threads
  pool = nullptr;
  new (&registry_mu) std::mutex();  // the parent may have held it while forking
}

void set_threads_locked(int n) {
  static const bool fork_handler = pthread_atfork(nullptr, nullptr, forget_pool_in_child) == 0;
  (void)fork_handler;
  requested_threads = n;
  set_blas_threads(n);
}

int decided_threads_locked() {
  if (requested_threads == 0) {
    set_threads_locked(detail::num_threads_from_env(
        [](const char* name) -> const char* { return std::getenv(name); }));
  }
  return requested_threads;
}

std::shared_ptr<Pool> pool_locked() {
  const int threads = decided_threads_locked();
  if (threads <= 1) return nullptr;
  if (pool == nullptr) {
    static const int spin_us =
        detail::spin_us_from_env([](const char* name) -> const char* { return std::getenv(name); });
    pool = std::make_shared<Pool>(threads, std::chrono::microseconds(spin_us));
  }
  return pool;
}

// `value` of the variable `name` as an integer in [lo, hi]; `what` names the expected value.
int parse_int(const char* name, const char* value, long lo, long hi, const char* what) {
  const std::string text(value);
  size_t used = 0;
  long parsed = 0;
  try {
    parsed = std::stol(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  HSGD_CHECK(used == text.size() && parsed >= lo && parsed <= hi, name, "='", text, "': expected ",
             what);
  return static_cast<int>(parsed);
}

int parse_positive(const char* name, const char* value) {
  return parse_int(name, value, 1, 4096, "a positive integer number of threads");
}

}  // namespace

namespace detail {

int num_threads_from_env(const char* (*env)(const char*)) {
  for (const char* name : {"HSGD_NUM_THREADS", "OMP_NUM_THREADS"}) {
    const char* value = env(name);
    if (value != nullptr && value[0] != '\0') return parse_positive(name, value);
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

int spin_us_from_env(const char* (*env)(const char*)) {
  const char* value = env("HSGD_SPIN_US");
  if (value == nullptr || value[0] == '\0') return kDefaultSpinUs;
  return parse_int("HSGD_SPIN_US", value, 0, 1000000,
                   "microseconds between 0 and 1000000 that an idle pool thread waits awake");
}

int64_t chunk_count(int64_t begin, int64_t end, int64_t grain, int threads) {
  if (end <= begin) return 0;
  const int64_t by_grain = (end - begin + grain - 1) / grain;
  return std::max<int64_t>(1, std::min<int64_t>(threads, by_grain));
}

void chunk_range(int64_t begin, int64_t end, int64_t count, int64_t i, int64_t& lo, int64_t& hi) {
  const int64_t n = end - begin;
  lo = begin + n * i / count;
  hi = begin + n * (i + 1) / count;
}

}  // namespace detail

int get_num_threads() {
  std::lock_guard<std::mutex> lock(registry_mu);
  return decided_threads_locked();
}

void set_num_threads(int n) {
  HSGD_CHECK(n >= 1, "set_num_threads: got ", n, ", expected at least 1");
  HSGD_CHECK(!tls_in_chunk, "set_num_threads: called from inside a parallel_for chunk");
  std::shared_ptr<Pool> old;  // joined after the lock is released, once its last job is done
  std::lock_guard<std::mutex> lock(registry_mu);
  old = std::move(pool);
  pool = nullptr;
  set_threads_locked(n);
}

namespace {

// parallel_for and parallel_for_dynamic: static chunks when dynamic is false, else pieces of
// grain indices claimed in turn by the same number of threads.
void run_parallel(const char* name, int64_t begin, int64_t end, int64_t grain, bool dynamic,
                  const std::function<void(int64_t, int64_t)>& fn) {
  HSGD_CHECK(grain >= 1, name, ": grain ", grain, " must be at least 1");
  if (end <= begin) return;
  std::shared_ptr<Pool> p;
  // A range of one grain is one chunk: it runs here without taking the registry's lock (most
  // elementwise calls of a step are that small).
  if (!tls_in_chunk && end - begin > grain) {
    std::lock_guard<std::mutex> lock(registry_mu);
    p = pool_locked();
  }
  const int64_t count = p == nullptr ? 1 : detail::chunk_count(begin, end, grain, p->threads());
  if (count > 1 && p->try_run({.begin = begin,
                               .end = end,
                               .count = count,
                               .piece = dynamic ? grain : 0,
                               .fn = &fn})) {
    return;
  }
  // Serially: the whole range is chunk 0 of this call, also when nested in another call's chunk.
  const int outer_index = tls_thread_index;
  tls_thread_index = 0;
  try {
    fn(begin, end);
  } catch (...) {
    tls_thread_index = outer_index;
    throw;
  }
  tls_thread_index = outer_index;
}

}  // namespace

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn) {
  run_parallel("parallel_for", begin, end, grain, false, fn);
}

void parallel_for_dynamic(int64_t begin, int64_t end, int64_t grain,
                          const std::function<void(int64_t, int64_t)>& fn) {
  run_parallel("parallel_for_dynamic", begin, end, grain, true, fn);
}

int parallel_thread_index() { return tls_thread_index; }

}  // namespace hsgd
