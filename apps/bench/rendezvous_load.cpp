// rendezvous_load: hsgd-rendezvous under hostile and idle load while a well-behaved client
// measures its latency: the server's guards must keep a well-behaved client served while hostile
// and idle clients hold connections. Prints a table.
//
//   rendezvous_load [--server PATH] [--idle 1000] [--slow 200] [--attack 200] [--seconds 20]
//
// The server runs as a child process (its RSS and CPU are its own; it is killed by pid at the
// end). Against it, for --seconds:
//   - a well-behaved TcpStore client does set / get / wait of its own keys every 10 ms from
//     start to end, and records each latency (baseline first, then under load);
//   - --idle connections sit idle: half completed their handshake, half never send a byte;
//   - --slow clients send a valid handshake, then a set request, one byte per second;
//   - --attack connections each send only the header 00 80 00 00 (a frame of 8 MiB) before
//     the handshake, the attack that once took the server from 7 MB to 1.6 GB.
// The server's RSS is printed before the load and at its end. Targets: p99 < 50 ms, RSS growth
// < 64 MB. This program raises its RLIMIT_NOFILE to the hard limit (the server inherits it).

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/bench/bench_util.h"
#include "comm/error.h"
#include "comm/rendezvous/frame.h"
#include "comm/rendezvous/proto/rendezvous.pb.h"
#include "comm/rendezvous/tcp_store.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
using hsgd::comm::kFrameHeaderBytes;

// ---- the server child ----

class ServerProcess {
 public:
  explicit ServerProcess(const std::string& path) {
    int fds[2];
    HSGD_CHECK(::pipe2(fds, O_CLOEXEC) == 0, "rendezvous_load: pipe2 failed");
    pid_ = ::fork();
    HSGD_CHECK(pid_ >= 0, "rendezvous_load: fork failed");
    if (pid_ == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      const int devnull = ::open("/dev/null", O_WRONLY);
      if (devnull >= 0) ::dup2(devnull, STDERR_FILENO);  // its warnings would drown the table
      // Insecure: the hostile clients speak raw frames of the plain protocol, the guards under
      // test. (Against TLS every one of them fails its handshake before reaching them.)
      ::execl(path.c_str(), path.c_str(), "--port", "0", "--insecure", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(fds[1]);
    // "listening on 127.0.0.1:PORT"
    std::string line;
    char c = 0;
    pollfd p{.fd = fds[0], .events = POLLIN, .revents = 0};
    while (line.size() < 200 && ::poll(&p, 1, 20000) > 0 && ::read(fds[0], &c, 1) == 1 &&
           c != '\n') {
      line += c;
    }
    ::close(fds[0]);
    const auto colon = line.rfind(':');
    port_ = colon == std::string::npos ? -1 : std::atoi(line.c_str() + colon + 1);
    HSGD_CHECK(port_ > 0, "rendezvous_load: ", path, " printed '", line,
               "' instead of 'listening on HOST:PORT'");
  }
  ~ServerProcess() {
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(50ms);
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  int port() const { return port_; }

  double rss_mb() const { return process_status_kb(pid_, "VmRSS") / 1024.0; }
  double cpu_seconds() const { return process_cpu_seconds(pid_); }

 private:
  pid_t pid_ = -1;
  int port_ = -1;
};

// ---- raw connections ----

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  HSGD_CHECK(fd >= 0, "rendezvous_load: socket: out of file descriptors?");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  HSGD_CHECK(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0,
             "rendezvous_load: connect to port ", port, " failed");
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

std::string frame_of(const google::protobuf::MessageLite& message) {
  return hsgd::comm::encode_frame(message, 1 << 20, "rendezvous_load");
}

std::string hello_frame(const std::string& job) {
  hsgd::comm::proto::Hello hello;
  hello.set_magic(hsgd::comm::kProtocolMagic);
  hello.set_version(hsgd::comm::kProtocolVersion);
  hello.set_job_id(job);
  return frame_of(hello);
}

void send_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    HSGD_CHECK(n > 0, "rendezvous_load: send failed");
    done += static_cast<size_t>(n);
  }
}

// Completes a handshake on fd (reads the reply, 10 s at most).
void handshake(int fd, const std::string& job) {
  send_all(fd, hello_frame(job));
  char header[kFrameHeaderBytes];
  size_t got = 0;
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  while (got < sizeof(header) && ::poll(&p, 1, 10000) > 0) {
    const ssize_t n = ::recv(fd, header + got, sizeof(header) - got, 0);
    HSGD_CHECK(n > 0, "rendezvous_load: the server closed a connection during its handshake");
    got += static_cast<size_t>(n);
  }
  std::string body(hsgd::comm::decode_frame_header(reinterpret_cast<uint8_t*>(header)), '\0');
  got = 0;
  while (got < body.size() && ::poll(&p, 1, 10000) > 0) {
    const ssize_t n = ::recv(fd, body.data() + got, body.size() - got, 0);
    HSGD_CHECK(n > 0, "rendezvous_load: the server closed a connection during its handshake");
    got += static_cast<size_t>(n);
  }
  hsgd::comm::proto::HelloReply reply;
  HSGD_CHECK(reply.ParseFromString(body) && reply.accepted(), "rendezvous_load: handshake of ", job,
             " refused: ", reply.error());
}

// ---- latency ----

struct Latencies {
  std::vector<double> set, get, wait;  // milliseconds
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

template <typename F>
void timed(std::vector<double>& out, F&& f) {
  const auto begin = Clock::now();
  f();
  out.push_back(std::chrono::duration<double, std::milli>(Clock::now() - begin).count());
}

void print_row(const char* phase, const char* op, const std::vector<double>& v) {
  std::printf("%-10s %-5s %8zu %11.3f %10.3f %10.3f\n", phase, op, v.size(),
              v.empty() ? 0.0 : median(v), percentile(v, 0.99),
              v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()));
}

void raise_fd_limit(size_t needed) {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);
  ::getrlimit(RLIMIT_NOFILE, &limit);
  HSGD_CHECK(limit.rlim_cur >= needed, "rendezvous_load: about ", needed,
             " file descriptors are needed, the hard limit is ", limit.rlim_cur,
             " (raise ulimit -Hn, or pass smaller --idle/--slow/--attack)");
}

std::string default_server_path() {
  namespace fs = std::filesystem;
  const fs::path self = fs::read_symlink("/proc/self/exe");
  return (self.parent_path().parent_path() / "hsgd-rendezvous" / "hsgd-rendezvous").string();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"rendezvous_load: hsgd-rendezvous under idle, slow and hostile clients"};
  std::string server_path = default_server_path();
  int idle = 1000, slow = 200, attack = 200, seconds = 20;
  app.add_option("--server", server_path, "the hsgd-rendezvous program")->capture_default_str();
  app.add_option("--idle", idle, "idle connections")->check(CLI::NonNegativeNumber);
  app.add_option("--slow", slow, "clients sending one byte a second")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--attack", attack, "connections announcing 8 MiB before the handshake")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seconds", seconds, "duration of the load")->check(CLI::Range(5, 600));
  CLI11_PARSE(app, argc, argv);

  try {
    raise_fd_limit(static_cast<size_t>(idle + slow + attack) + 128);
    ServerProcess server(server_path);
    const int port = server.port();
    hsgd::comm::TcpStore store(
        {.port = port, .job_id = "measure", .insecure = true, .connect_timeout = 10s});
    store.set("warm-up", hsgd::comm::to_bytes("1"));
    const double rss_before = server.rss_mb();
    const double cpu_before = server.cpu_seconds();

    // The well-behaved client: set / get / wait every 10 ms, from start to end.
    Latencies baseline, loaded;
    std::atomic<bool> under_load = false, done = false;
    std::string client_error;
    std::thread measure([&] {
      try {
        for (int i = 0; !done.load(); ++i) {
          Latencies& into = under_load.load() ? loaded : baseline;
          const std::string key = "key" + std::to_string(i % 1000);
          timed(into.set, [&] { store.set(key, hsgd::comm::to_bytes("value")); });
          timed(into.get, [&] { store.get(key, 10s); });
          timed(into.wait, [&] { store.wait({key}, 10s); });
          std::this_thread::sleep_for(10ms);
        }
      } catch (const std::exception& e) {
        client_error = e.what();
      }
    });
    std::this_thread::sleep_for(2s);  // baseline
    under_load.store(true);
    const auto load_start = Clock::now();

    std::vector<int> fds;
    // Pre-login attack: 00 80 00 00 and nothing else.
    const auto big = hsgd::comm::encode_frame_header(8u << 20);
    for (int i = 0; i < attack; ++i) {
      fds.push_back(connect_to(port));
      send_all(fds.back(), std::string(big.begin(), big.end()));
    }
    // Idle: half logged in, half silent.
    for (int i = 0; i < idle; ++i) {
      fds.push_back(connect_to(port));
      if (i % 2 == 0) handshake(fds.back(), "idle-" + std::to_string(i % 10));
    }
    // Slow clients: a handshake and a set request, one byte per second.
    hsgd::comm::proto::Request set;
    set.set_id(1);
    set.set_op(hsgd::comm::proto::OP_SET);
    set.add_keys("slow");
    set.add_values("x");
    const std::string slow_bytes = hello_frame("slow-job") + frame_of(set);
    std::vector<int> slow_fds;
    for (int i = 0; i < slow; ++i) slow_fds.push_back(connect_to(port));
    const auto opened = Clock::now();
    size_t sent = 0;
    int slow_closed = 0;
    while (Clock::now() - load_start < std::chrono::seconds(seconds)) {
      if (sent < slow_bytes.size()) {
        for (int& fd : slow_fds) {
          if (fd >= 0 && ::send(fd, slow_bytes.data() + sent, 1, MSG_NOSIGNAL) != 1) {
            ::close(fd);
            fd = -1;
            ++slow_closed;
          }
        }
        ++sent;
      }
      std::this_thread::sleep_for(1s);
    }
    const double rss_after = server.rss_mb();
    const double cpu = server.cpu_seconds() - cpu_before;
    done.store(true);
    measure.join();

    std::printf(
        "rendezvous_load: %d idle (half logged in), %d slow (1 byte/s, %zu of %zu bytes sent, "
        "%d closed by the server), %d pre-login 8 MiB announcements; %d s of load (connections "
        "opened in %.1f s)\n",
        idle, slow, sent, slow_bytes.size(), slow_closed, attack, seconds,
        std::chrono::duration<double>(opened - load_start).count());
    std::printf("%-10s %-5s %8s %11s %10s %10s\n", "phase", "op", "count", "median [ms]",
                "p99 [ms]", "max [ms]");
    print_row("baseline", "set", baseline.set);
    print_row("baseline", "get", baseline.get);
    print_row("baseline", "wait", baseline.wait);
    print_row("load", "set", loaded.set);
    print_row("load", "get", loaded.get);
    print_row("load", "wait", loaded.wait);
    std::vector<double> all = loaded.set;
    all.insert(all.end(), loaded.get.begin(), loaded.get.end());
    all.insert(all.end(), loaded.wait.begin(), loaded.wait.end());
    const double p99 = percentile(all, 0.99);
    std::printf(
        "server RSS: %.1f MB before, %.1f MB at the end of the load (growth %.1f MB); "
        "server CPU during the load: %.2f s\n",
        rss_before, rss_after, rss_after - rss_before, cpu);
    std::printf("targets: p99 under load %.3f ms < 50 ms: %s; RSS growth < 64 MB: %s\n", p99,
                p99 < 50 ? "met" : "MISSED", rss_after - rss_before < 64 ? "met" : "MISSED");
    for (int fd : fds) ::close(fd);
    for (int fd : slow_fds) {
      if (fd >= 0) ::close(fd);
    }
    if (!client_error.empty()) {
      std::cerr << "rendezvous_load: the measuring client failed: " << client_error << std::endl;
      return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
  return 0;
}
