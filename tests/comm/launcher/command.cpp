#include "command.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <utility>

#include "comm/launcher/worker_env.h"
#include "tests/support/multiprocess.h"

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

const std::string& test_token_file() {
  static const std::string path = [] {
    const auto dir = unique_temp_dir("hsgd_launcher_token");
    const auto file = dir / "token";
    std::ofstream(file) << kLauncherTestToken << "\n";
    std::filesystem::permissions(
        file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    return file.string();
  }();
  return path;
}

Rendezvous start_rendezvous(const std::string& program) {
  return start_rendezvous(program, test_token_file());
}

Rendezvous start_rendezvous(const std::string& program, const std::string& token_file) {
  auto cmd =
      Command::start({program, "--host", "127.0.0.1", "--port", "0", "--token-file", token_file});
  // The very line that is parsed, whole: the server's log line "rendezvous: listening on ..."
  // on stderr may come first, and a line may arrive in pieces.
  const std::regex line("(^|\n)listening on 127\\.0\\.0\\.1:(\\d+)\n");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::smatch m;
  std::string out = cmd.output();
  while (!std::regex_search(out, m, line) && std::chrono::steady_clock::now() < deadline) {
    // Reads for up to 50 ms; the text is one no program prints, so it only paces the loop.
    cmd.wait_for_output("\x01", std::chrono::milliseconds(50));
    out = cmd.output();
  }
  EXPECT_FALSE(m.empty()) << "no 'listening on 127.0.0.1:PORT' line within 30 s: " << out;
  const int port = m.empty() ? 0 : std::stoi(m[2]);
  return Rendezvous{std::move(cmd), port, port == 0 ? "" : "127.0.0.1:" + std::to_string(port)};
}

}  // namespace hsgd::testing
