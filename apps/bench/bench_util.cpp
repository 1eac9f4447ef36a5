#include "apps/bench/bench_util.h"

#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <fstream>
#include <sstream>

#include "comm/error.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

}  // namespace

double median(std::vector<double> values) {
  HSGD_CHECK(!values.empty(), "median of no values");
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::vector<std::string> run_forked_ranks(int world, Clock::duration timeout,
                                          const std::string& name,
                                          const std::function<std::string(int rank)>& body) {
  HSGD_CHECK(world >= 1, name, ": world size ", world, " must be at least 1");
  std::vector<pid_t> pids;
  std::vector<int> fds;  // read end of each rank's pipe, -1 once it reached end of file
  std::fflush(stdout);   // or the children would print the parent's buffered output again
  std::fflush(stderr);
  for (int rank = 0; rank < world; ++rank) {
    int p[2];
    HSGD_CHECK_AS(hsgd::Error, ::pipe(p) == 0, name, ": pipe failed");
    const pid_t pid = ::fork();
    HSGD_CHECK_AS(hsgd::Error, pid >= 0, name, ": fork failed");
    if (pid == 0) {
      ::close(p[0]);
      int code = 0;
      std::string out;
      try {
        out = body(rank);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        code = 1;
      }
      for (size_t done = 0; done < out.size();) {
        const ssize_t n = ::write(p[1], out.data() + done, out.size() - done);
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    ::close(p[1]);
    pids.push_back(pid);
    fds.push_back(p[0]);
  }
  const auto deadline = Clock::now() + timeout;
  auto kill_all = [&] {
    for (pid_t pid : pids) ::kill(pid, SIGKILL);
    for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  };
  // A child's pipe reaches end of file when it exits, so reading until every pipe is closed waits
  // for every child, bounded by the deadline.
  std::vector<std::string> outputs(static_cast<size_t>(world));
  for (;;) {
    std::vector<pollfd> open;
    std::vector<size_t> rank_of;
    for (size_t r = 0; r < fds.size(); ++r) {
      if (fds[r] >= 0) {
        open.push_back({fds[r], POLLIN, 0});
        rank_of.push_back(r);
      }
    }
    if (open.empty()) break;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 ||
        ::poll(open.data(), open.size(), static_cast<int>(left.count())) == 0) {
      kill_all();
      HSGD_THROW(hsgd::Timeout, name, ": no result after ",
                 std::chrono::duration_cast<std::chrono::seconds>(timeout).count(),
                 " s; every rank killed");
    }
    for (size_t i = 0; i < open.size(); ++i) {
      if (open[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = ::read(open[i].fd, buf, sizeof buf);
      if (n > 0) {
        outputs[rank_of[i]].append(buf, static_cast<size_t>(n));
      } else {
        ::close(open[i].fd);
        fds[rank_of[i]] = -1;
      }
    }
  }
  std::string failures;
  for (size_t r = 0; r < pids.size(); ++r) {
    int status = 0;
    // The pipe is closed, so the child has exited or is about to; no deadline is needed here.
    ::waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      failures += (failures.empty() ? "" : ", ") +
                  ("rank " + std::to_string(r) + ": " + describe_status(status));
    }
  }
  HSGD_CHECK_AS(hsgd::Error, failures.empty(), name, " failed (", failures,
                "; their messages are above)");
  return outputs;
}

std::vector<std::vector<std::string>> run_python_results(const std::string& script,
                                                         const std::vector<std::string>& args,
                                                         int timeout_s) {
  std::string command = "timeout ";
  command += std::to_string(timeout_s);
  command += " /usr/bin/python3 ";
  command += shell_quote(script);
  for (const std::string& a : args) {
    command += ' ';
    command += shell_quote(a);
  }
  command += " 2>&1";
  std::fflush(stdout);
  FILE* pipe = ::popen(command.c_str(), "r");
  HSGD_CHECK_AS(hsgd::Error, pipe != nullptr, "could not run '", command, "'");
  std::string output;
  std::vector<std::vector<std::string>> results;
  char line[4096];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    output += line;
    std::istringstream in(line);
    std::string word;
    if (!(in >> word) || word != "RESULT") continue;
    std::vector<std::string> fields;
    while (in >> word) fields.push_back(word);
    results.push_back(std::move(fields));
  }
  const int status = ::pclose(pipe);
  HSGD_CHECK_AS(hsgd::Error, status == 0 && !results.empty(), "'", command, "' failed (",
                status == 0 ? std::string("no RESULT line") : describe_status(status),
                "): ", output);
  return results;
}

double process_status_kb(pid_t pid, const std::string& field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1));
  }
  return -1;
}

StepMeasurement parse_step_measurement(const std::vector<std::string>& fields,
                                       const std::string& what) {
  StepMeasurement m;
  const bool ok = fields.size() == 2;
  if (ok) {
    std::istringstream(fields[0]) >> m.step_ms;
    std::istringstream(fields[1]) >> m.peak_mb;
  }
  HSGD_CHECK_AS(hsgd::Error, ok && m.step_ms > 0, what,
                ": expected 'STEP_MS PEAK_MB' with a positive step, got ", fields.size(),
                " fields");
  return m;
}

StepMeasurement measure_in_child(const std::string& what,
                                 const std::function<StepMeasurement()>& measure) {
  const std::vector<std::string> out =
      run_forked_ranks(1, std::chrono::seconds(900), what, [&](int) {
        const StepMeasurement m = measure();
        std::ostringstream o;
        o << m.step_ms << " " << m.peak_mb;
        return o.str();
      });
  std::istringstream in(out[0]);
  std::vector<std::string> fields;
  for (std::string f; in >> f;) fields.push_back(f);
  return parse_step_measurement(fields, what);
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

double reset_peak_rss_mb() {
  std::ofstream("/proc/self/clear_refs") << "5";
  return process_status_kb(::getpid(), "VmRSS") / 1024.0;
}

double process_cpu_seconds(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return -1;
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i >= 14) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}
