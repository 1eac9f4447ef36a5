#pragma once
// run_forked_ranks(world, deadline, name, body): the benchmarks' way to run `world` ranks as
// forked processes. Each child runs body(rank) and exits 0, or 1 after printing the exception.
// The parent waits for all of them; past the deadline it kills every child by pid (nothing is
// left running) and returns false. Returns true only when every rank exited 0.
//
// Usage:
//   bool ok = run_forked_ranks(4, std::chrono::minutes(20), "resnet20", [&](int rank) {
//     // one rank of the benchmark: init_process_group({.rank = rank, .world_size = 4, ...}) ...
//   });

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

inline bool run_forked_ranks(int world, std::chrono::steady_clock::duration timeout,
                             const std::string& name, const std::function<void(int)>& body) {
  std::vector<pid_t> pids;
  std::fflush(stdout);  // or the children would print the parent's buffered output again
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      try {
        body(rank);
      } catch (const std::exception& e) {
        std::cerr << "rank " << rank << ": " << e.what() << "\n";
        code = 1;
      }
      _exit(code);
    }
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool ok = true;
  size_t done = 0;
  while (done < pids.size()) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      ++done;
      ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    } else if (std::chrono::steady_clock::now() > deadline) {
      for (pid_t p : pids) kill(p, SIGKILL);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      std::cerr << name << ": deadline passed, ranks killed\n";
      return false;
    } else {
      usleep(20000);
    }
  }
  return ok;
}
