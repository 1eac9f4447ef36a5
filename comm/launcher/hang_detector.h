#pragma once
// HangDetector: hsgd-run's side of the progress heartbeat (comm/process_group/worker_progress.h) on
// one node. It owns the shared-memory file the workers write, watches it, and names a hung worker.
//
// A worker counts as hung (find_hung) when, for `timeout` in a row, either
//   - it is stopped (process state T in /proc/PID/stat: SIGSTOP, SIGTSTP), whatever it was
//     doing (counted from its last progress when it reports any, else from the first sample
//     that saw it stopped); or
//   - it reported progress at least once (so it uses hsgd), its counter did not move, it is not
//     inside a collective, and another worker of this node is waiting inside one: the others
//     wait for it, it is not waiting for anyone. Without such a waiter (one worker per node, or
//     all ranks computing, e.g. evaluating) silence alone proves nothing, and nothing is named.
// suspect() is the same test without the duration, for a collective that failed on a peer: the
// root cause of a collective timeout is the rank that did not arrive, not the one that raised.
//
// Steps: last_step() is the highest step any local worker reported, resumed_step() the lowest
// first step (what a restarted attempt resumed from); -1 when nobody reported one.
//
// Contract: the file is a memfd that workers open as /proc/<hsgd-run pid>/fd/<fd> (nothing is
// left behind, even after kill -9), or where memfd_create fails a file in /dev/shm (the
// temporary directory when that is missing), mode 0600, removed by the destructor. Creating it
// throws hsgd::Error naming the path. Used from one thread.
//
// Usage:
//   using namespace std::chrono_literals;
//   HangDetector progress(/*slots=*/4, /*rank_offset=*/0, "node 0 'host'");
//   std::vector<std::string> env{"HSGD_PROGRESS_FILE=" + progress.path()};
//   std::vector<pid_t> pids;   // the workers, by local rank
//   // every tick of the agent:
//   progress.observe(HangDetector::Clock::now(), pids);
//   if (auto hang = progress.find_hung(HangDetector::Clock::now(), 60s)) {
//     // hang->message names the worker
//   }

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_group/worker_progress.h"

namespace hsgd::comm::launcher {

class HangDetector {
 public:
  using Clock = std::chrono::steady_clock;

  struct Snapshot {
    uint64_t beats = 0;
    uint64_t in_collective = 0;
    uint64_t collective_failures = 0;
    int64_t step = -1;
    int64_t first_step = -1;
  };

  struct Hang {
    int local_rank = -1;
    std::string message;  // "rank 2 (node 0 'h', local rank 2, pid 123) is stopped (...) ..."
  };

  // slots: the workers of this node; rank_offset: the global rank of local rank 0; node: how
  // messages name this node ("node 0 'host'").
  HangDetector(int slots, int rank_offset, std::string node);
  ~HangDetector();
  HangDetector(const HangDetector&) = delete;
  HangDetector& operator=(const HangDetector&) = delete;

  const std::string& path() const { return path_; }

  Snapshot read(int local_rank) const;

  // Samples every slot and the process state of pids[local_rank] (<= 0: exited, not watched).
  void observe(Clock::time_point now, const std::vector<pid_t>& pids);

  // The first worker hung for at least timeout (see above), if any.
  std::optional<Hang> find_hung(Clock::time_point now, std::chrono::milliseconds timeout) const;

  // A worker other than `failed` that others wait for right now: stopped, or silent outside a
  // collective for at least min_silence while another worker is (or was, `failed`) in one.
  std::optional<Hang> suspect(Clock::time_point now, int failed,
                              std::chrono::milliseconds min_silence) const;

  int64_t last_step() const;
  int64_t resumed_step() const;

 private:
  struct Watch {
    pid_t pid = -1;
    uint64_t beats = 0;
    Clock::time_point changed;                 // when beats last changed
    std::optional<Clock::time_point> stopped;  // since when the process is stopped
  };

  std::optional<Hang> check(int local, Clock::time_point now, std::chrono::milliseconds timeout,
                            int waiting_also) const;
  std::string describe(int local) const;

  // Constant after construction.
  const int rank_offset_;
  const std::string node_;
  std::string path_;
  detail::ProgressSlot* slots_ = nullptr;  // mapped
  size_t bytes_ = 0;
  int memfd_ = -1;  // kept open: it is the file
  // Watch state.
  std::vector<Watch> watch_;
};

}  // namespace hsgd::comm::launcher
