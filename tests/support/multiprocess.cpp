#include "tests/support/multiprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <sstream>
#include <thread>

namespace hsgd::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Runs body in the child and returns its failure message ("" on success).
std::string run_body(int rank, const std::function<void(int)>& body) {
  try {
    body(rank);
  } catch (const std::exception& e) {
    return std::string("exception: ") + e.what();
  } catch (...) {
    return "unknown exception";
  }
  if (::testing::Test::HasFailure()) return "GoogleTest assertion failed (see output above)";
  return "";
}

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

std::string read_all(int fd) {
  std::string text;
  char buf[4096];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

struct Child {
  pid_t pid = -1;
  int pipe_fd = -1;  // read end; the child writes its failure message
  bool done = false;
  std::string reason = "";  // empty = success
};

std::string describe_status(int status, const std::string& message) {
  if (WIFEXITED(status)) {
    if (WEXITSTATUS(status) == 0 && message.empty()) return "";
    if (!message.empty()) return message;
    return "exited with status " + std::to_string(WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status)) {
    return std::string("killed by signal ") + strsignal(WTERMSIG(status)) +
           (message.empty() ? "" : " after: " + message);
  }
  return "stopped with wait status " + std::to_string(status);
}

}  // namespace

std::string RunResult::describe() const {
  std::ostringstream out;
  out << failures.size() << " of " << world_size << " ranks failed";
  for (const auto& f : failures) out << "\n  rank " << f.rank << ": " << f.reason;
  return out.str();
}

RunResult run_ranks(int world_size, std::chrono::milliseconds timeout,
                    const std::function<void(int rank)>& body) {
  return run_ranks(world_size, RunOptions{.timeout = timeout}, body);
}

RunResult run_ranks(int world_size, const RunOptions& options,
                    const std::function<void(int rank)>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<Child> children(static_cast<size_t>(world_size));
  for (int rank = 0; rank < world_size; ++rank) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      throw std::runtime_error(std::string("run_ranks: pipe failed: ") + std::strerror(errno));
    }
    pid_t pid = ::fork();
    if (pid < 0) {
      throw std::runtime_error(std::string("run_ranks: fork failed: ") + std::strerror(errno));
    }
    if (pid == 0) {
      ::close(fds[0]);
      // Die with the parent, so that a killed test leaves no orphan ranks behind.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      std::string message = run_body(rank, body);
      if (!message.empty()) {
        std::fprintf(stderr, "[rank %d] %s\n", rank, message.c_str());
        write_all(fds[1], message);
      }
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(message.empty() ? 0 : 1);
    }
    ::close(fds[1]);
    children[static_cast<size_t>(rank)] = Child{.pid = pid, .pipe_fd = fds[0]};
  }

  const auto deadline = Clock::now() + options.timeout;
  auto kill_at = deadline;
  std::string kill_reason =
      "killed after the " + std::to_string(options.timeout.count()) + " ms deadline";
  int running = world_size;
  while (running > 0) {
    for (auto& child : children) {
      if (child.done) continue;
      int status = 0;
      pid_t r = ::waitpid(child.pid, &status, WNOHANG);
      if (r != child.pid) continue;
      child.done = true;
      --running;
      child.reason = describe_status(status, read_all(child.pipe_fd));
      ::close(child.pipe_fd);
      if (!child.reason.empty() && Clock::now() + options.failure_grace < kill_at) {
        kill_at = Clock::now() + options.failure_grace;
        kill_reason = "killed " + std::to_string(options.failure_grace.count()) +
                      " ms after another rank failed";
      }
    }
    if (running == 0) break;
    if (Clock::now() >= kill_at) {
      for (auto& child : children) {
        if (child.done) continue;
        ::kill(child.pid, SIGKILL);
        int status = 0;
        ::waitpid(child.pid, &status, 0);
        child.done = true;
        const std::string message = read_all(child.pipe_fd);
        ::close(child.pipe_fd);
        child.reason = kill_reason + (message.empty() ? "" : " (" + message + ")");
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  RunResult result{.world_size = world_size};
  for (int rank = 0; rank < world_size; ++rank) {
    const auto& child = children[static_cast<size_t>(rank)];
    if (!child.reason.empty()) result.failures.push_back({rank, child.reason});
  }
  return result;
}

RunResult run_ranks_in_threads(int world_size, std::chrono::milliseconds timeout,
                               const std::function<void(int rank)>& body) {
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  std::vector<std::string> reasons(static_cast<size_t>(world_size));
  std::vector<bool> done(static_cast<size_t>(world_size), false);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      std::string reason;
      try {
        body(rank);
      } catch (const std::exception& e) {
        reason = std::string("exception: ") + e.what();
      } catch (...) {
        reason = "unknown exception";
      }
      std::lock_guard<std::mutex> lock(mu);
      reasons[static_cast<size_t>(rank)] = reason;
      done[static_cast<size_t>(rank)] = true;
      ++finished;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, timeout, [&] { return finished == world_size; })) {
      std::fprintf(stderr, "run_ranks_in_threads: deadline of %lld ms passed; still running:",
                   static_cast<long long>(timeout.count()));
      for (int rank = 0; rank < world_size; ++rank) {
        if (!done[static_cast<size_t>(rank)]) std::fprintf(stderr, " rank %d", rank);
      }
      std::fprintf(stderr, "\n");
      std::abort();
    }
  }
  for (auto& t : threads) t.join();
  RunResult result{.world_size = world_size};
  for (int rank = 0; rank < world_size; ++rank) {
    if (!reasons[static_cast<size_t>(rank)].empty()) {
      result.failures.push_back({rank, reasons[static_cast<size_t>(rank)]});
    }
  }
  return result;
}

std::filesystem::path unique_temp_dir(const std::string& tag) {
  std::string pattern =
      (std::filesystem::temp_directory_path() / ("hsgd_" + tag + "_XXXXXX")).string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error("unique_temp_dir: mkdtemp(" + pattern +
                             ") failed: " + std::strerror(errno));
  }
  return pattern;
}

}  // namespace hsgd::testing
