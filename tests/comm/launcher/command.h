#pragma once
// Command: a program started by a launcher test (hsgd-run, hsgd-rendezvous), its output captured.
// Built on WorkerProcess, so the command runs in its own process group, dies with the test
// (PR_SET_PDEATHSIG) and is SIGKILLed with its group when the Command is destroyed: a failing
// test never leaves processes behind.
//
// Usage:
//   auto cmd = Command::start({"/bin/sh", "-c", "echo hello"});
//   auto result = cmd.wait(std::chrono::seconds(60));
//   EXPECT_EQ(result.status.exit_code, 0) << result.output;

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/launcher/worker_process.h"

namespace hsgd::testing {

class Command {
 public:
  struct Result {
    bool timed_out = false;  // then the command was killed
    comm::launcher::ExitStatus status;
    std::string output;  // stdout and stderr, interleaved as read
  };

  // Starts argv with this process's environment plus extra_env ("NAME=value", overriding).
  static Command start(const std::vector<std::string>& argv,
                       const std::vector<std::string>& extra_env = {});

  Command(Command&& other) noexcept;
  Command& operator=(Command&&) = delete;
  Command(const Command&) = delete;
  Command& operator=(const Command&) = delete;
  ~Command();

  pid_t pid() const { return process_.pid(); }

  // Collects output until the command exits, or kills it (whole group) at the timeout.
  Result wait(std::chrono::milliseconds timeout);

  // Collects output until `text` appeared or timeout passed (or the command exited); returns
  // whether it appeared.
  bool wait_for_output(const std::string& text, std::chrono::milliseconds timeout);

  // Sends sig to the command's process only (like `kill PID`), not to its group.
  void signal(int sig);

  const std::string& output() const { return output_; }

 private:
  explicit Command(comm::launcher::WorkerProcess process);
  void read_some(std::chrono::milliseconds timeout);

  comm::launcher::WorkerProcess process_;
  int fds_[2] = {-1, -1};
  std::string output_;
};

// A hsgd-rendezvous (`program`) started on 127.0.0.1 with a port of its choosing and token_file
// (test_token_file() by default), and that port.
// Fails the test (port 0, empty endpoint) when it does not say where it listens within 30 s.
struct Rendezvous {
  Command command;
  int port = 0;
  std::string endpoint;  // "127.0.0.1:<port>"
};
Rendezvous start_rendezvous(const std::string& program, const std::string& token_file);
Rendezvous start_rendezvous(const std::string& program);

// The token every launcher test's hsgd-rendezvous and hsgd-run share (kLauncherTestToken), as a
// file of mode 0600 made once per test process: pass it as --token-file (or HSGD_TOKEN_FILE).
inline constexpr char kLauncherTestToken[] = "launcher-test-token";
const std::string& test_token_file();

// A finished command's exit status and output, for failure messages.
std::string show(const Command::Result& result);

// The whole content of a file ("" when it cannot be read).
std::string slurp(const std::filesystem::path& path);

// A loopback port nobody listens on (bound once by the kernel, then released).
int unused_port();

}  // namespace hsgd::testing
