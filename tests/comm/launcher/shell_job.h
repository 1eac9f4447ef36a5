#pragma once
// What the in-process agent tests (agent_test.cpp, elastic_agent_test.cpp) share: options for a
// job of small shell workers, and bounded waits on the processes and files they leave.
//
// Usage:
//   auto options = shell_job("echo rank $RANK", dir / "logs", /*nproc=*/2);
//   const bool started = wait_for([&] { return std::filesystem::exists(dir / "started"); },
//                                 std::chrono::seconds(10));

#include <signal.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

#include "comm/launcher/agent.h"

namespace hsgd::comm::launcher {

inline AgentOptions shell_job(const std::string& script, const std::filesystem::path& log_dir,
                              int nproc = 2) {
  return AgentOptions{.nproc_per_node = nproc,
                      .run_id = "agent-test",
                      .rdzv_timeout = std::chrono::seconds(20),
                      .grace_period = std::chrono::seconds(5),
                      .monitor_interval = std::chrono::milliseconds(20),
                      .program = {"/bin/sh", "-c", script},
                      .output = {.log_dir = log_dir.string()}};
}

// How many entries of dir have a name starting with prefix.
inline int count_files(const std::filesystem::path& dir, const std::string& prefix) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) ++n;
  }
  return n;
}

inline bool process_exists(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

// Polls `done` every 10 ms until it holds or `timeout` passed; returns whether it held.
inline bool wait_for(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace hsgd::comm::launcher
