#include "command.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <regex>
#include <sstream>
#include <utility>

#include "comm/launcher/worker_env.h"

namespace hsgd::testing {

using Clock = std::chrono::steady_clock;

Command::Command(comm::launcher::WorkerProcess process) : process_(std::move(process)) {
  fds_[0] = process_.take_stdout_fd();
  fds_[1] = process_.take_stderr_fd();
}

Command::Command(Command&& other) noexcept
    : process_(std::move(other.process_)), output_(std::move(other.output_)) {
  fds_[0] = std::exchange(other.fds_[0], -1);
  fds_[1] = std::exchange(other.fds_[1], -1);
}

Command::~Command() {
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

Command Command::start(const std::vector<std::string>& argv,
                       const std::vector<std::string>& extra_env) {
  auto env = comm::launcher::current_environment();
  for (const auto& entry : extra_env) {
    const std::string name = entry.substr(0, entry.find('=') + 1);
    std::erase_if(env, [&](const std::string& e) { return e.rfind(name, 0) == 0; });
    env.push_back(entry);
  }
  return Command(comm::launcher::WorkerProcess::spawn(argv, env));
}

void Command::read_some(std::chrono::milliseconds timeout) {
  pollfd fds[2];
  nfds_t n = 0;
  int* owners[2];
  for (int& fd : fds_) {
    if (fd < 0) continue;
    fds[n] = pollfd{fd, POLLIN, 0};
    owners[n++] = &fd;
  }
  if (::poll(fds, n, static_cast<int>(timeout.count())) <= 0) return;
  for (nfds_t i = 0; i < n; ++i) {
    if (fds[i].revents == 0) continue;
    char buffer[4096];
    ssize_t got = ::read(fds[i].fd, buffer, sizeof(buffer));
    if (got > 0) {
      output_.append(buffer, static_cast<size_t>(got));
    } else if (got == 0 || errno != EINTR) {
      ::close(*owners[i]);
      *owners[i] = -1;
    }
  }
}

Command::Result Command::wait(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  Result result;
  std::optional<Clock::time_point> exited_at;
  while (true) {
    const bool exited = process_.poll().has_value();
    if (exited && !exited_at) exited_at = Clock::now();
    if (exited && fds_[0] < 0 && fds_[1] < 0) break;
    // Output pipes may outlive the command if it leaked them to a child: do not wait for that.
    if (exited && Clock::now() - *exited_at > std::chrono::seconds(2)) break;
    if (Clock::now() >= deadline) {
      result.timed_out = !exited;
      break;
    }
    read_some(std::chrono::milliseconds(exited ? 5 : 50));
  }
  process_.kill_and_reap();
  for (int& fd : fds_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  result.status = *process_.poll();
  result.output = output_;
  return result;
}

bool Command::wait_for_output(const std::string& text, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (output_.find(text) == std::string::npos) {
    if (Clock::now() >= deadline || (fds_[0] < 0 && fds_[1] < 0)) return false;
    read_some(std::chrono::milliseconds(50));
  }
  return true;
}

void Command::signal(int sig) { ::kill(process_.pid(), sig); }

std::string show(const Command::Result& r) {
  return "exit status: " + r.status.describe() + (r.timed_out ? " (timed out, killed)" : "") +
         "\n--- output ---\n" + r.output;
}

std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int unused_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

Rendezvous start_rendezvous(const std::string& program) {
  auto cmd = Command::start({program, "--host", "127.0.0.1", "--port", "0"});
  EXPECT_TRUE(cmd.wait_for_output("\n", std::chrono::seconds(30))) << cmd.output();
  std::smatch m;
  const std::string out = cmd.output();
  EXPECT_TRUE(std::regex_search(out, m, std::regex("listening on 127\\.0\\.0\\.1:(\\d+)"))) << out;
  const int port = m.empty() ? 0 : std::stoi(m[1]);
  return Rendezvous{std::move(cmd), port, port == 0 ? "" : "127.0.0.1:" + std::to_string(port)};
}

}  // namespace hsgd::testing
