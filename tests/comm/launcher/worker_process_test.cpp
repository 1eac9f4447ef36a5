#include "comm/launcher/worker_process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <thread>

#include "comm/error.h"
#include "comm/launcher/worker_env.h"

namespace hsgd::comm::launcher {
namespace {

ExitStatus wait_exit(WorkerProcess& w) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!w.poll() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(w.poll().has_value()) << "worker pid " << w.pid() << " did not exit in 20 s";
  w.kill_and_reap();
  return w.poll().value_or(ExitStatus{.exit_code = -1});
}

std::string read_all(int fd) {
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

bool process_exists(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

TEST(WorkerProcessTest, ReportsExitCodeAndOutput) {
  auto w =
      WorkerProcess::spawn({"sh", "-c", "echo out; echo err >&2; exit 5"}, current_environment());
  const std::string out = read_all(w.take_stdout_fd());
  const std::string err = read_all(w.take_stderr_fd());
  ExitStatus s = wait_exit(w);
  EXPECT_EQ(s.exit_code, 5);
  EXPECT_EQ(s.signal, 0);
  EXPECT_FALSE(s.success());
  EXPECT_EQ(s.describe(), "exit code 5");
  EXPECT_EQ(out, "out\n");
  EXPECT_EQ(err, "err\n");
}

TEST(WorkerProcessTest, ReportsSignal) {
  auto w = WorkerProcess::spawn({"sh", "-c", "kill -SEGV $$"}, current_environment());
  ExitStatus s = wait_exit(w);
  EXPECT_EQ(s.signal, SIGSEGV);
  EXPECT_EQ(s.describe(), "signal 11 (SIGSEGV)");
}

TEST(WorkerProcessTest, PassesExactlyTheGivenEnvironment) {
  auto w = WorkerProcess::spawn({"/bin/sh", "-c", "echo \"$HSGD_X|${HOME-unset}\""}, {"HSGD_X=42"});
  const std::string out = read_all(w.take_stdout_fd());
  EXPECT_TRUE(wait_exit(w).success());
  EXPECT_EQ(out, "42|unset\n");
}

TEST(WorkerProcessTest, MissingProgram_ThrowsNamingIt) {
  try {
    WorkerProcess::spawn({"no-such-program-hsgd"}, current_environment());
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'no-such-program-hsgd' not found on PATH"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(WorkerProcess::spawn({"/etc/passwd"}, {}), InvalidArgument);
}

TEST(WorkerProcessTest, KillAndReap_KillsGrandchildrenInTheGroup) {
  // The worker forks a sleeping child and prints its pid; killing the group must kill both.
  auto w = WorkerProcess::spawn({"sh", "-c", "sleep 60 & echo $!; wait"}, current_environment());
  int out = w.take_stdout_fd();
  std::string line;
  char c;
  while (::read(out, &c, 1) == 1 && c != '\n') line += c;
  ::close(out);
  const pid_t grandchild = std::stoi(line);
  ASSERT_TRUE(process_exists(grandchild));
  w.kill_and_reap();
  EXPECT_EQ(w.poll()->signal, SIGKILL);
  // The grandchild is not our child: init reaps it soon after the SIGKILL.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (process_exists(grandchild) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(process_exists(grandchild)) << "grandchild pid " << grandchild << " survived";
}

TEST(WorkerProcessTest, DestructorLeavesNoProcess) {
  pid_t pid;
  {
    auto w = WorkerProcess::spawn({"sleep", "60"}, current_environment());
    pid = w.pid();
    ASSERT_TRUE(process_exists(pid));
  }
  EXPECT_FALSE(process_exists(pid)) << "pid " << pid << " still exists after the destructor";
}

}  // namespace
}  // namespace hsgd::comm::launcher
