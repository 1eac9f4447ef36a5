#include "tests/comm/rendezvous/rendezvous_test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "comm/rendezvous/frame.h"

namespace hsgd::comm::testing {

TcpStoreOptions client_options(const RendezvousServer& server, std::string job, std::string token) {
  return {.host = server.host(),
          .port = server.port(),
          .job_id = std::move(job),
          .token = server.insecure() ? "" : std::move(token),
          .insecure = server.insecure(),
          .connect_timeout = std::chrono::seconds(10),
          .timeout = std::chrono::seconds(20)};
}

std::unique_ptr<RendezvousServer> start_server(RendezvousServerOptions options) {
  options.port = 0;
  if (!options.insecure && options.token.empty() && options.job_tokens.empty()) {
    options.token = kTestToken;
  }
  auto server = std::make_unique<RendezvousServer>(options);
  server->start();
  return server;
}

std::unique_ptr<RendezvousServer> start_plain_server(RendezvousServerOptions options) {
  options.port = 0;
  options.insecure = true;
  auto server = std::make_unique<RendezvousServer>(options);
  server->start();
  return server;
}

using Clock = std::chrono::steady_clock;

bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds deadline) {
  const auto end = Clock::now() + deadline;
  while (Clock::now() < end) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return condition();
}

RawClient::RawClient(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list) != 0) {
    throw std::runtime_error("RawClient: cannot resolve " + host);
  }
  fd_ = ::socket(list->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int rc = ::connect(fd_, list->ai_addr, list->ai_addrlen);
  freeaddrinfo(list);
  if (rc != 0) throw std::runtime_error("RawClient: connect: " + std::string(strerror(errno)));
}

RawClient::~RawClient() { close(); }

void RawClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void RawClient::send_bytes(const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) throw std::runtime_error("RawClient: send failed");
    done += static_cast<size_t>(n);
  }
}

void RawClient::send_frame(const std::string& payload) {
  const auto header = encode_frame_header(static_cast<uint32_t>(payload.size()));
  send_bytes(std::string(header.begin(), header.end()) + payload);
}

proto::HelloReply RawClient::hello(const std::string& job, uint32_t version) {
  proto::Hello hello;
  hello.set_magic(kProtocolMagic);
  hello.set_version(version == 0 ? kProtocolVersion : version);
  hello.set_job_id(job);
  send_frame(hello.SerializeAsString());
  auto frame = read_frame();
  if (!frame) throw std::runtime_error("RawClient: no handshake reply");
  proto::HelloReply reply;
  if (!reply.ParseFromString(*frame)) throw std::runtime_error("RawClient: bad handshake reply");
  return reply;
}

namespace {

// Reads exactly size bytes; false on EOF, error or timeout.
bool read_exact(int fd, char* out, size_t size, Clock::time_point deadline) {
  size_t done = 0;
  while (done < size) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    const ssize_t n = ::recv(fd, out + done, size - done, 0);
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

std::optional<std::string> RawClient::read_frame(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  char header[kFrameHeaderBytes];
  if (!read_exact(fd_, header, kFrameHeaderBytes, deadline)) return std::nullopt;
  std::string body(decode_frame_header(reinterpret_cast<uint8_t*>(header)), '\0');
  if (!read_exact(fd_, body.data(), body.size(), deadline)) return std::nullopt;
  return body;
}

bool RawClient::closed_by_server(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  char byte;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    const ssize_t n = ::recv(fd_, &byte, 1, 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const ChildOptions& options) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    ::dup2(pipe_fds[1], STDOUT_FILENO);
    if (!options.stderr_path.empty()) {
      const int err = ::open(options.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (err < 0) ::_exit(126);
      ::dup2(err, STDERR_FILENO);
      ::close(err);
    }
    if (options.max_open_files > 0) {
      const rlimit limit{.rlim_cur = static_cast<rlim_t>(options.max_open_files),
                         .rlim_max = static_cast<rlim_t>(options.max_open_files)};
      if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(125);
    }
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  out_fd_ = pipe_fds[0];
}

ChildProcess::~ChildProcess() {
  if (!exited_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
}

std::optional<std::string> ChildProcess::read_line(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto newline = buffer_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      return line;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{.fd = out_fd_, .events = POLLIN, .revents = 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      return std::nullopt;
    }
    char chunk[256];
    const ssize_t n = ::read(out_fd_, chunk, sizeof(chunk));
    if (n <= 0) return std::nullopt;
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

void ChildProcess::signal(int sig) {
  if (!exited_) ::kill(pid_, sig);
}

std::optional<int> ChildProcess::wait(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exited_ = true;
      return status;
    }
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

size_t ChildProcess::rss_bytes() const {
  std::ifstream status("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      size_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

double ChildProcess::cpu_seconds() const {
  std::ifstream stat("/proc/" + std::to_string(pid_) + "/stat");
  std::string text;
  std::getline(stat, text);
  // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
  const auto close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i >= 14) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

}  // namespace hsgd::comm::testing
