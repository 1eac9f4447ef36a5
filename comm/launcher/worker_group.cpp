#include "comm/launcher/worker_group.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "comm/error.h"
#include "comm/launcher/exit_codes.h"

namespace hsgd::comm::launcher {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::string this_host(const std::string& configured) {
  if (!configured.empty()) return configured;
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

namespace {

int make_wake_fd(const std::string& who) {
  int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  HSGD_CHECK_AS(Error, fd >= 0, who, ": eventfd failed: ", std::strerror(errno));
  return fd;
}

}  // namespace

StopRequests::StopRequests(const std::string& who) : wake_fd_(make_wake_fd(who)) {}

StopRequests::~StopRequests() { ::close(wake_fd_); }

void StopRequests::request(int sig) {
  int expected = 0;
  first_.compare_exchange_strong(expected, sig);
  last_.store(sig);
  count_.fetch_add(1);
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

bool append_last_lines(std::ostream& msg, OutputRouter& output, int rank) {
  const auto lines = output.tail(rank);
  if (lines.empty()) return false;
  msg << "; its last " << lines.size() << " line(s):";
  for (const auto& line : lines) msg << "\n    [rank " << rank << "] " << line;
  return true;
}

void signal_workers(std::vector<WorkerProcess>& workers, int sig) {
  for (auto& w : workers) {
    if (w.poll()) continue;
    w.signal_group(sig);
    // A stopped worker (SIGSTOP) would keep the signal pending until SIGKILL.
    w.signal_group(SIGCONT);
  }
}

int reap_workers(std::vector<WorkerProcess>& workers, OutputRouter* output, milliseconds grace,
                 const std::function<bool()>& skip_grace) {
  const auto deadline = Clock::now() + grace;
  auto all_exited = [&] {
    for (auto& w : workers) {
      if (!w.poll()) return false;
    }
    return true;
  };
  while (!all_exited() && Clock::now() < deadline && !skip_grace()) {
    if (output != nullptr) {
      output->pump(milliseconds(20));
    } else {
      ::usleep(20'000);
    }
  }
  int killed = 0;
  for (auto& w : workers) {
    if (!w.poll()) ++killed;
    w.kill_and_reap();
  }
  if (output != nullptr) output->drain(milliseconds(200));
  return killed;
}

bool workers_preempted(std::vector<WorkerProcess>& workers) {
  bool preempted = false;
  for (auto& w : workers) {
    const auto& status = w.poll();
    if (!status || status->signal != 0) return false;
    if (status->exit_code == kExitPreempted) {
      preempted = true;
    } else if (status->exit_code != 0) {
      return false;
    }
  }
  return preempted;
}

FailureRecord worker_exit_record(const std::string& who, const std::string& when,
                                 const std::string& stopped, const ExitStatus& status,
                                 OutputRouter& output, int rank, int node_rank) {
  const bool preempted = status.signal == 0 && status.exit_code == kExitPreempted;
  const bool will_repeat = status.signal == 0 && status.exit_code == kExitWillRepeat;
  std::ostringstream msg;
  msg << who << " ";
  if (preempted) {
    // Not a failure: its output is the program's own account of the checkpoint.
    msg << "was preempted: it exited " << kExitPreempted
        << " after writing its part of a checkpoint, in " << when << "; " << stopped
        << " is not restarted";
    return FailureRecord{.kind = FailureRecord::Kind::kPreempted,
                         .node_rank = node_rank,
                         .rank = rank,
                         .message = msg.str()};
  }
  msg << "failed with " << status.describe() << " in " << when;
  if (will_repeat) {
    msg << " (" << kExitWillRepeat << ": a restart would fail the same way; not restarting)";
  }
  if (!append_last_lines(msg, output, rank)) msg << "; it printed nothing";
  if (const std::string path = output.log_path(rank); !path.empty()) {
    msg << "\n  full output: " << path;
  }
  return FailureRecord{
      .kind = will_repeat ? FailureRecord::Kind::kWillRepeat : FailureRecord::Kind::kWorkerFailed,
      .node_rank = node_rank,
      .rank = rank,
      .message = msg.str()};
}

}  // namespace hsgd::comm::launcher
