#pragma once
// The steps every launch agent takes with the workers of its node, whatever decides the job's
// membership (LaunchAgent's attempts, agent.h; ElasticAgent's generations, elastic_agent.h):
// naming this machine, stopping the workers (signal, grace period, SIGKILL, reap) and describing
// how a worker ended.
//
// Contract:
// - reap_workers() waits at most `grace` (less when skip_grace() turns true) and then SIGKILLs
//   and reaps every worker still there: no worker survives it. Output keeps flowing meanwhile, so
//   a worker blocked on a full pipe can exit.
// - worker_exit_record() describes a worker that exited with a status other than 0: kPreempted
//   for kExitPreempted, kWillRepeat for kExitWillRepeat, else kWorkerFailed; the message names the
//   worker (`who`), the status, where it happened (`when`) and the worker's last output lines.
//
// Usage:
//   StopRequests stop("my agent");  // stop.request(SIGTERM) from a signal-forwarding thread
//   std::vector<WorkerProcess> workers;  // spawned with WorkerProcess::spawn
//   signal_workers(workers, SIGTERM);
//   const int killed = reap_workers(workers, nullptr, std::chrono::seconds(10), [] { return false;
//   });

#include <signal.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "comm/launcher/failure_record.h"
#include "comm/launcher/output_router.h"
#include "comm/launcher/worker_process.h"

namespace hsgd::comm::launcher {

// `configured` when set, else gethostname() ("unknown-host" when that fails).
std::string this_host(const std::string& configured);

// How request_stop(sig), called from any thread or a signal handler, reaches the agent's run()
// thread: the first signal is kept, and an eventfd (wake_fd) becomes readable to end a poll.
class StopRequests {
 public:
  // Error naming `who` when no eventfd can be made.
  explicit StopRequests(const std::string& who);
  ~StopRequests();
  StopRequests(const StopRequests&) = delete;
  StopRequests& operator=(const StopRequests&) = delete;

  // Async-signal-safe: atomics and write(2) only.
  void request(int sig);
  // The first requested signal, 0 before any request.
  int signal() const { return first_.load(); }
  bool requested() const { return signal() != 0; }
  int wake_fd() const { return wake_fd_; }
  // A second request by SIGINT (Ctrl-C twice) skips the grace period; a repeated SIGTERM or
  // SIGUSR1 (a scheduler's, while the workers write their checkpoint) does not.
  bool skip_grace() const { return count_.load() >= 2 && last_.load() == SIGINT; }

 private:
  const int wake_fd_;
  std::atomic<int> first_{0};
  std::atomic<int> count_{0};
  std::atomic<int> last_{0};
};

// "SIGTERM", or "signal N" for an unnamed one.
std::string signal_name(int sig);

// Appends "; its last N line(s):" and the lines of rank's output; returns false (appending
// nothing) when it printed nothing.
bool append_last_lines(std::ostream& msg, OutputRouter& output, int rank);

// Sends sig (then SIGCONT, so that a stopped worker acts on it) to every worker still running.
void signal_workers(std::vector<WorkerProcess>& workers, int sig);

// Waits for the workers to exit (see the contract above), then SIGKILLs and reaps the rest.
// Returns how many had to be killed. `output` may be null.
int reap_workers(std::vector<WorkerProcess>& workers, OutputRouter* output,
                 std::chrono::milliseconds grace, const std::function<bool()>& skip_grace);

// Whether the workers were preempted: every one is gone, at least one exited kExitPreempted (it
// wrote its part of the checkpoint) and none failed (a worker may have finished the run just then).
bool workers_preempted(std::vector<WorkerProcess>& workers);

// The record of a worker that exited with `status` (not 0). `who`: "rank 3 (node 1 'a', local
// rank 1, pid 42)"; `when`: "attempt 2"; `stopped`: what is not restarted after a preemption
// ("the job"). `rank` is the worker's key in `output`.
FailureRecord worker_exit_record(const std::string& who, const std::string& when,
                                 const std::string& stopped, const ExitStatus& status,
                                 OutputRouter& output, int rank, int node_rank);

}  // namespace hsgd::comm::launcher
