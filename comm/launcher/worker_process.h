#pragma once
// WorkerProcess: one worker program started by hsgd-run, in its own process group.
//
// Contract:
// - spawn() starts argv[0] (searched on PATH when it has no '/') with exactly the environment
//   `env`, stdout and stderr connected to two pipes whose read ends the caller takes
//   (take_stdout_fd / take_stderr_fd). A program that cannot be executed throws
//   hsgd::InvalidArgument naming it and the reason; nothing is left running.
// - The child is the leader of a new process group (so the worker and everything it forks can be
//   signalled together) and gets PR_SET_PDEATHSIG(SIGKILL): if the spawning thread dies, even by
//   SIGKILL, the worker dies too. Hence spawn from a thread that outlives the worker.
// - poll() notices the exit without reaping it: the zombie keeps the process group id reserved,
//   so signal_group() can never hit an unrelated process group that reused the id.
// - kill_and_reap() (also run by the destructor) SIGKILLs the whole group and reaps the worker.
//   No orphan survives a WorkerProcess.
//
// Usage:
//   auto w = WorkerProcess::spawn({"/bin/echo", "hi"}, {"PATH=/bin"});
//   int out = w.take_stdout_fd();   // read the output from it
//   while (!w.poll()) { /* wait */ }
//   w.kill_and_reap();

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace hsgd::comm::launcher {

// How a process ended: normally with an exit code, or by a signal.
struct ExitStatus {
  int exit_code = 0;  // meaningful when signal == 0
  int signal = 0;     // the terminating signal, 0 if the process exited normally

  bool success() const { return signal == 0 && exit_code == 0; }
  // "exit code 3" or "signal 9 (SIGKILL)".
  std::string describe() const;
};

class WorkerProcess {
 public:
  static WorkerProcess spawn(const std::vector<std::string>& argv,
                             const std::vector<std::string>& env);

  WorkerProcess(WorkerProcess&& other) noexcept;
  WorkerProcess& operator=(WorkerProcess&& other) noexcept;
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;
  ~WorkerProcess();

  pid_t pid() const { return pid_; }

  // The read ends of the worker's stdout/stderr pipes; the caller owns them (-1 once taken).
  int take_stdout_fd();
  int take_stderr_fd();

  // Returns the exit status once the worker has exited (never blocks, does not reap).
  const std::optional<ExitStatus>& poll();

  // Sends sig to the worker's whole process group; no-op once reaped.
  void signal_group(int sig);

  // SIGKILLs the process group and waits for the worker to be reaped. Idempotent.
  void kill_and_reap();

 private:
  WorkerProcess() = default;

  pid_t pid_ = -1;
  bool reaped_ = true;
  int stdout_fd_ = -1;
  int stderr_fd_ = -1;
  std::optional<ExitStatus> status_;
};

// Resolves a program name like execvp does (PATH lookup when it has no '/'); throws
// hsgd::InvalidArgument naming the program when it is not found or not executable.
std::string resolve_program(const std::string& program, const std::string& path_env);

}  // namespace hsgd::comm::launcher
