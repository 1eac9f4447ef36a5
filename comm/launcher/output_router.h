#pragma once
// OutputRouter: forwards the output of the local workers, line by line.
//
// Contract:
// - Each worker stream (a pipe read end) is added with the worker's global rank; the router owns
//   and closes the fd.
// - Terminal mode (no log_dir): every complete line is written as "[rank N] line\n" to the
//   router's stdout_fd (worker stdout) or stderr_fd (worker stderr). Lines of different ranks
//   never interleave inside a line.
// - Log-dir mode: both streams of rank N go, unprefixed, to <log_dir>/attempt_<k>/rank_<N>.log
//   and nothing is written to the terminal. The directory is created; failure throws
//   hsgd::InvalidArgument naming it.
// - The last tail_lines lines of each rank (both streams) are kept for failure reports.
// - A partial last line is flushed when its stream ends (and when the router is destroyed).
// - Nothing read is dropped on a slow terminal: a non-blocking stdout that is full is waited on
//   (up to 2 s without progress; only a reader that stalls longer loses lines).
//
// Usage:
//   OutputRouter router(OutputOptions{}, /*attempt=*/0);
//   auto worker = WorkerProcess::spawn({"/bin/echo", "hi"}, {"PATH=/bin"});
//   router.add(/*rank=*/0, worker.take_stdout_fd(), OutputRouter::Stream::kStdout);
//   while (!worker.poll()) router.pump(std::chrono::milliseconds(100));

#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <deque>
#include <map>
#include <string>
#include <vector>

namespace hsgd::comm::launcher {

struct OutputOptions {
  int stdout_fd = STDOUT_FILENO;  // not owned
  int stderr_fd = STDERR_FILENO;  // not owned
  std::string log_dir{};          // empty: prefix lines on the terminal
  size_t tail_lines = 20;
};

class OutputRouter {
 public:
  enum class Stream { kStdout, kStderr };

  OutputRouter(OutputOptions options, int attempt);
  ~OutputRouter();
  OutputRouter(const OutputRouter&) = delete;
  OutputRouter& operator=(const OutputRouter&) = delete;

  // Takes ownership of fd, the read end of rank's stdout or stderr.
  void add(int rank, int fd, Stream stream);

  // Waits up to timeout for output on any stream (or for wake_fd to become readable; it is not
  // read) and forwards what arrived. Returns true if wake_fd is readable.
  bool pump(std::chrono::milliseconds timeout, int wake_fd = -1);

  // Forwards output until every stream of `rank` (every stream when rank < 0) has ended or
  // timeout passes. A stream may stay open after its worker exited if the worker left children
  // holding it; the timeout bounds that wait.
  void drain(std::chrono::milliseconds timeout, int rank = -1);

  // The last lines (at most tail_lines) that rank wrote, oldest first.
  std::vector<std::string> tail(int rank) const;

  // The log file of rank in log-dir mode, empty otherwise.
  std::string log_path(int rank) const;

 private:
  struct Source {
    int rank;
    Stream stream;
    int fd;
    std::string pending;  // bytes after the last newline
  };

  void read_source(Source& source);
  void emit_line(const Source& source, std::string_view line);
  void write_all(int fd, std::string_view data);
  bool open_sources_of(int rank) const;

  // Constant after construction.
  const OutputOptions options_;
  const std::string attempt_dir_;
  // Mutable state (the router is used from one thread).
  std::vector<Source> sources_;
  std::map<int, int> log_fds_;  // rank -> file (log-dir mode)
  std::map<int, std::deque<std::string>> tails_;
};

}  // namespace hsgd::comm::launcher
