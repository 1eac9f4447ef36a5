#pragma once
// hsgd's intra-op parallelism: one process-wide pool of threads that the kernels split their work
// across (convolutions over blocks of samples, batch norm over channels, elementwise ops over
// ranges), and the BLAS thread count kept equal to it so that the two never oversubscribe.
//
// Usage:
//   hsgd::set_num_threads(2);                       // like torch.set_num_threads
//   const int64_t n = 100000;
//   std::vector<float> x(n, 1.0f), y(n);
//   hsgd::parallel_for(0, n, 4096, [&](int64_t lo, int64_t hi) {
//     for (int64_t i = lo; i < hi; ++i) y[i] = 2 * x[i];
//   });
//
// The thread count starts as HSGD_NUM_THREADS, else OMP_NUM_THREADS, else the number of CPUs the
// process may run on (its affinity mask). hsgd-run sets all of them to 1 when a node runs several
// workers, as torchrun does. A value that is not a positive integer is an error naming it.
//
// parallel_for splits [begin, end) into at most get_num_threads() contiguous chunks of at least
// `grain` indices (fewer chunks when the range is small), in a fixed way that depends only on the
// range, the grain and the thread count; chunk i always runs on pool thread i (the caller is
// thread 0). Kernels that sum across chunks therefore give the same result on every run with the
// same thread count, and kernels whose chunks are independent (one output element per index) give
// the same result at every thread count.
//
// A parallel_for called from inside a chunk, or while another thread of the process is using the
// pool, runs serially in the calling thread: nesting and concurrent callers (a data-loading
// thread, a communication thread) are safe and never wait for each other. If chunks throw, the
// caller rethrows the first exception after every chunk has finished.
//
// A pool thread that finishes its chunk waits awake (pause, then sched_yield) for the next job
// for HSGD_SPIN_US microseconds (default 300) before it sleeps: on a VM, waking a sleeping thread
// costs about as much as a small kernel. 0 sleeps after about a thousand pause instructions, the
// choice when the process shares its cores with other busy processes.
//
// After fork() the child starts with no pool threads and makes its own on first use, so forked
// workers (tests, benchmarks) neither hang nor share the parent's threads.

#include <cstdint>
#include <functional>

namespace hsgd {

// The number of threads parallel_for uses (>= 1).
int get_num_threads();

// Sets the thread count of parallel_for and of OpenBLAS (when the process uses OpenBLAS). Throws
// hsgd::InvalidArgument unless n >= 1. Must not be called from inside a parallel_for chunk.
void set_num_threads(int n);

// Runs fn(lo, hi) over disjoint chunks covering [begin, end) and returns when all have run. grain
// (>= 1) is the smallest chunk worth a thread; begin >= end does nothing.
void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn);

// As parallel_for, for ranges of independent blocks: the same threads (as many as parallel_for's
// chunks, detail::chunk_count) claim pieces of `grain` indices in turn until none is left, so a
// thread that starts late or is slowed (another process, a preempted vCPU) takes fewer. fn runs
// once per piece; which thread runs which piece varies from call to call. For kernels whose result
// per block does not depend on the thread (per-block outputs or per-block partial sums added in
// block order), whose per-thread workspace is indexed by parallel_thread_index().
void parallel_for_dynamic(int64_t begin, int64_t end, int64_t grain,
                          const std::function<void(int64_t, int64_t)>& fn);

// The index of the chunk running on this thread, in [0, get_num_threads()): chunk i runs on pool
// thread i (for parallel_for_dynamic: the thread's index among those claiming pieces); 0 outside
// parallel_for and in serial runs (nested ones included). Lets a kernel keep one workspace per
// chunk.
int parallel_thread_index();

namespace detail {
// The thread count the environment asks for (HSGD_NUM_THREADS, OMP_NUM_THREADS, affinity), as
// described above; env is getenv or a stand-in for tests. Throws hsgd::InvalidArgument naming the
// variable and its value when it is not a positive integer.
int num_threads_from_env(const char* (*env)(const char*));
// How long an idle pool thread waits awake, in microseconds: HSGD_SPIN_US, else kDefaultSpinUs.
// Throws hsgd::InvalidArgument naming the value unless it is an integer in [0, 1000000].
constexpr int kDefaultSpinUs = 300;
int spin_us_from_env(const char* (*env)(const char*));
// The chunks parallel_for makes: chunk i of chunk_count(...) is [begin + i*len/count rounded...).
int64_t chunk_count(int64_t begin, int64_t end, int64_t grain, int threads);
void chunk_range(int64_t begin, int64_t end, int64_t count, int64_t i, int64_t& lo, int64_t& hi);
}  // namespace detail

}  // namespace hsgd
