// The runtime's preemption signals (framework/runtime/preemption.h), each case in a child process
// of its own (signal dispositions are process-wide): once a check decided to stop, a later SIGTERM
// does not end the process, also after the check is gone; before any decision, a signal to a
// process with no armed check ends it by the default action.

#include "framework/runtime/preemption.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <functional>
#include <thread>

#include "comm/process_group/init.h"

namespace hsgd::runtime {
namespace {

// Runs body in a forked child and returns its wait status.
int run_child(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(PreemptionTest, AfterAStopWasDecided_ALaterSigtermDoesNotEndTheProcess) {
  const int status = run_child([] {
    install_preemption_signals();
    auto world = comm::init_process_group(comm::InitOptions{});
    {
      PreemptionCheck check(world, /*armed=*/true);
      ::kill(::getpid(), SIGUSR1);
      bool stop = false;
      for (int i = 0; i < 200 && !stop; ++i) {
        stop = check.stop_now();
        if (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (!stop) return 2;
    }  // the check is gone, as when the training loop has returned
    ::kill(::getpid(), SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return 75;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 75);
}

TEST(PreemptionTest, WithoutADecision_ASignalAfterTheCheckEndsTheProcess) {
  const int status = run_child([] {
    install_preemption_signals();
    auto world = comm::init_process_group(comm::InitOptions{});
    { PreemptionCheck check(world, /*armed=*/true); }
    ::kill(::getpid(), SIGTERM);
    std::this_thread::sleep_for(std::chrono::seconds(5));
    return 0;
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "exited " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
}

}  // namespace
}  // namespace hsgd::runtime
