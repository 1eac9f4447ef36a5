// hsgd-run and the workers' progress heartbeat (comm/process_group/worker_progress.h), end to end
// with the real launcher and launcher_test_worker's "steps" mode (an allreduce and a progress
// report per step, a "checkpoint" every 4 steps, resume from it):
// - a stopped (SIGSTOP) or looping worker is named within seconds with --worker-timeout 3 and
//   the job restarts and finishes;
// - when a collective times out first, the root cause is the rank that did not arrive;
// - the final line counts the steps lost to restarts;
// - SIGTERM of hsgd-run keeps the workers' last lines.

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>

#include "command.h"
#include "tests/support/multiprocess.h"

namespace hsgd::testing {
namespace {

using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

const std::string kRun = HSGD_RUN_PATH;
const std::string kWorker = LAUNCHER_TEST_WORKER_PATH;

// 4 workers, 16 steps; rank 2 goes silent (`fault`) after step 10 of attempt 0. The collective
// timeout stays at its default (300 s), far beyond the test's timeout: only the progress
// heartbeat can find the hang in time.
Command::Result run_with_fault(const std::string& fault, const std::vector<std::string>& flags,
                               const std::vector<std::string>& env = {}) {
  const auto dir = unique_temp_dir("hsgd_run_progress");
  std::vector<std::string> argv = {kRun, "--nproc-per-node", "4", "--max-restarts",
                                   "1",  "--grace-period",   "2"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  for (const std::string& a : {std::string("--"), kWorker, std::string("steps"), dir.string(),
                               std::string("16"), fault, std::string("10")}) {
    argv.push_back(a);
  }
  return Command::start(argv, env).wait(seconds(60));
}

void expect_restarted_and_finished(const Command::Result& r) {
  EXPECT_FALSE(r.timed_out) << show(r);
  EXPECT_EQ(r.status.exit_code, 0) << show(r);
  EXPECT_NE(r.output.find("restarting all nodes: attempt 1 of 2"), std::string::npos) << show(r);
  EXPECT_NE(r.output.find("[rank 0] resumed from step 8"), std::string::npos) << show(r);
  EXPECT_NE(r.output.find("[rank 0] step 16"), std::string::npos) << show(r);
}

TEST(HsgdRunProgressTest, StoppedWorker_NamedWithinSecondsAndJobRestarts) {
  const auto start = Clock::now();
  auto r = run_with_fault("stop", {"--worker-timeout", "3"});
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  const std::regex root(
      "attempt 0 failed\\. Root cause: rank 2 \\(node 0 '[^']*', local rank 2, pid \\d+\\) is "
      "stopped \\(process state T, e\\.g\\. SIGSTOP\\) and made no progress for [3-9]\\.\\d s; its "
      "last step: 10 "
      "\\[--worker-timeout 3 s, attempt 0\\]");
  EXPECT_TRUE(std::regex_search(r.output, root)) << show(r);
  expect_restarted_and_finished(r);
  // Without the heartbeat the others would wait for the 300 s collective timeout.
  EXPECT_LT(elapsed, 60) << show(r);
}

TEST(HsgdRunProgressTest, LoopingWorker_NamedAsTheOneTheOthersWaitFor) {
  auto r = run_with_fault("loop", {"--worker-timeout", "3"});
  const std::regex root(
      "Root cause: rank 2 \\(node 0 '[^']*', local rank 2, pid \\d+\\) made no progress for "
      "[3-9]\\.\\d s outside any collective while rank\\(s\\) 0, 1, 3 waited in one \\(stuck or "
      "looping\\); its last step: 10");
  EXPECT_TRUE(std::regex_search(r.output, root)) << show(r);
  expect_restarted_and_finished(r);
}

TEST(HsgdRunProgressTest, CollectiveTimeout_RootCauseIsTheRankThatDidNotArrive) {
  // The heartbeat check is off and the collective timeout short: a waiting rank raises the
  // timeout, and hsgd-run must still name rank 2, not the rank that raised it.
  auto r = run_with_fault("stop", {"--worker-timeout", "0"}, {"HSGD_TIMEOUT_MS=3000"});
  const std::regex root(
      "attempt 0 failed\\. Root cause: rank 2 \\(node 0 '[^']*', local rank 2, pid \\d+\\) is "
      "stopped .*; it is the rank that did not arrive in the collective that failed on rank "
      "[013] \\[attempt 0\\]\\. Rank [013]'s report: rank [013] .* failed with exit code 10");
  EXPECT_TRUE(std::regex_search(r.output, root)) << show(r);
  expect_restarted_and_finished(r);
}

TEST(HsgdRunProgressTest, StepsLostToRestarts_InTheFinalLine) {
  // Rank 2 exits after step 10; the last "checkpoint" is step 8: 2 steps lost.
  auto r = run_with_fault("exit", {});
  expect_restarted_and_finished(r);
  EXPECT_NE(r.output.find("finished: all workers of all nodes exited 0 after 1 restart(s); 2 "
                          "steps lost to restarts"),
            std::string::npos)
      << show(r);
  // No restart, no loss: the count is there and is 0.
  auto clean = run_with_fault("none", {});
  EXPECT_EQ(clean.status.exit_code, 0) << show(clean);
  EXPECT_NE(clean.output.find("after 0 restart(s); 0 steps lost to restarts"), std::string::npos)
      << show(clean);
}

TEST(HsgdRunProgressTest, Sigterm_WorkersLastLinesAppear) {
  const auto dir = unique_temp_dir("hsgd_run_last_words");
  auto run =
      Command::start({kRun, "--nproc-per-node", "2", "--", kWorker, "last-words", dir.string()});
  // Both ranks wrote both lines (the partial one cannot show before the stream ends).
  for (int rank = 0; rank < 2; ++rank) {
    const auto written = dir / ("printed_rank" + std::to_string(rank));
    for (int i = 0; i < 600 && !std::filesystem::exists(written); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(std::filesystem::exists(written)) << run.output();
  }
  run.signal(SIGTERM);
  auto r = run.wait(seconds(60));
  EXPECT_EQ(r.status.exit_code, 128 + SIGTERM) << show(r);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string prefix = "[rank " + std::to_string(rank) + "] ";
    EXPECT_NE(r.output.find(prefix + "last words before the end"), std::string::npos) << show(r);
    // Printed without a newline just before the sleep: flushed when hsgd-run stops the workers.
    EXPECT_NE(r.output.find(prefix + "partial line at the end\n"), std::string::npos) << show(r);
  }
}

}  // namespace
}  // namespace hsgd::testing
