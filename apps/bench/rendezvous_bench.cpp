// rendezvous_bench: N clients each publish a key and wait for everybody's (the pattern Gloo's
// connectFullMesh uses), against a RendezvousServer in a child process; prints a table.
//
//   rendezvous_bench [--clients 1024,2048,4096,8192,16384] [--runs 5] [--value-bytes 64]
//                    [--client-processes 1] [--check bytes|protobuf] [--max-connecting 2048]
//                    [--max-waiting 0] [--server-threads 1]
//                    [--max-waits-per-job W] [--max-job-bytes B] [--timeout 300]
//
// One run: a fresh server process starts (RendezvousServer, 127.0.0.1, a free port); the clients
// (rendezvous_fleet.h: one epoll loop per client process, each client the protocol TcpStore
// speaks) connect, set "rank<i>" and multi_get all N keys, which the server answers once the last
// key arrived; every value of every reply is checked; then the server is killed. Times are from
// the start of the client processes until the last client had checked its reply (total) and
// until the last handshake was answered (connected). The server's memory is its peak RSS
// (VmHWM, reset before the clients start) minus its RSS when idle, per client; CPU times are
// user + system over the run, of the server and of all client processes. The table gives medians
// over --runs runs.
//
// Pacing: at most --max-connecting connections per client process are between connect() and the
// handshake's answer. The kernel queues at most net.core.somaxconn (4096 here) connections the
// server has not accepted yet and drops further SYNs, which clients send again only after 1 s,
// 3 s, 7 s: 16,384 connects at once then measure the kernel's retry timer, not the server.
//
// Limits: the server's quota of pending waits per job is raised to N (the default 10,000 would
// refuse larger jobs); --max-job-bytes sets its byte quota per job (default: the server's).
// This program raises its RLIMIT_NOFILE (to what N clients need, as root beyond the hard limit);
// the processes it forks inherit it.

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/bench/bench_util.h"
#include "apps/bench/rendezvous_fleet.h"
#include "comm/error.h"
#include "comm/rendezvous/rendezvous_server.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// ---- resources ----

// The server holds one descriptor per client, a client process one per client of its own.
void raise_fd_limit(size_t clients) {
  const rlim_t needed = clients + 1024;
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  if (limit.rlim_max < needed) limit.rlim_max = needed;  // allowed to root only
  limit.rlim_cur = limit.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    ::getrlimit(RLIMIT_NOFILE, &limit);
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
  ::getrlimit(RLIMIT_NOFILE, &limit);
  HSGD_CHECK(limit.rlim_cur >= needed, "rendezvous_bench: ", clients, " clients need ", needed,
             " file descriptors per process, the limit is ", limit.rlim_cur,
             " (run as root, or raise ulimit -Hn)");
}

// ---- the server process ----

// A RendezvousServer in a forked child, so that its RSS and CPU time are its own. It dies with
// this process (PR_SET_PDEATHSIG) and is stopped by the destructor (SIGTERM, then SIGKILL, by
// pid). Create it while this process has no other threads.
class ServerProcess {
 public:
  explicit ServerProcess(const hsgd::comm::RendezvousServerOptions& options) {
    int fds[2];
    HSGD_CHECK(::pipe2(fds, O_CLOEXEC) == 0, "rendezvous_bench: pipe2 failed");
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    HSGD_CHECK(pid_ >= 0, "rendezvous_bench: fork failed");
    if (pid_ == 0) {
      ::close(fds[0]);
      serve(options, parent, fds[1]);
    }
    ::close(fds[1]);
    int port = 0;
    const ssize_t n = ::read(fds[0], &port, sizeof(port));  // EOF if the child failed
    ::close(fds[0]);
    if (n != sizeof(port) || port <= 0) {
      stop();
      HSGD_THROW(hsgd::CommError, "rendezvous_bench: the server process did not start");
    }
    port_ = port;
  }

  ~ServerProcess() { stop(); }

  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }

  // Sets VmHWM back to the current RSS (clear_refs 5), so that it gives the peak from now on.
  void reset_peak() const {
    std::ofstream clear("/proc/" + std::to_string(pid_) + "/clear_refs");
    clear << "5";
  }

 private:
  // The child: serves until SIGTERM, or until the parent is gone.
  [[noreturn]] static void serve(const hsgd::comm::RendezvousServerOptions& options, pid_t parent,
                                 int port_fd) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    ::pthread_sigmask(SIG_BLOCK, &term, nullptr);  // before the I/O threads exist
    try {
      hsgd::comm::RendezvousServer server(options);
      server.start();
      const int port = server.port();
      if (::write(port_fd, &port, sizeof(port)) != sizeof(port)) ::_exit(1);
      ::close(port_fd);
      const timespec second{.tv_sec = 1, .tv_nsec = 0};
      while (::sigtimedwait(&term, nullptr, &second) != SIGTERM) {
        if (::getppid() != parent) break;
      }
      server.stop();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rendezvous_bench: server process: %s\n", e.what());
      ::_exit(1);
    }
    ::_exit(0);
  }

  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 200; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(50ms);
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  pid_t pid_ = -1;
  int port_ = 0;
};

// ---- one run ----

struct BenchOptions {
  int runs = 5;
  size_t value_bytes = 64;
  int client_processes = 1;
  hsgd::bench::FleetCheck check = hsgd::bench::FleetCheck::kBytes;
  int max_connecting = 2048;
  int max_waiting = 0;
  int server_threads = 1;
  size_t max_waits_per_job = 0;  // 0: the number of clients (at least the server's default)
  size_t max_job_bytes = hsgd::comm::RendezvousServerOptions{}.max_job_bytes;
  int timeout_s = 300;
};

struct RunResult {
  double total = 0;        // s, until the last reply was checked
  double connected = 0;    // s, until the last handshake was answered
  double server_cpu = 0;   // s
  double clients_cpu = 0;  // s, all client processes together
  double server_peak_mb = 0;
  double server_kb_per_client = 0;
};

hsgd::comm::RendezvousServerOptions server_options(const BenchOptions& bench, int clients) {
  // Insecure: the fleet's clients speak the plain protocol from one epoll loop each; what is
  // measured is the server's protocol path (waits, shared answers), not TLS handshakes.
  hsgd::comm::RendezvousServerOptions options{.host = "127.0.0.1", .port = 0, .insecure = true};
  options.threads = bench.server_threads;
  options.max_waits_per_job = bench.max_waits_per_job > 0 ? bench.max_waits_per_job
                                                          : std::max(options.max_waits_per_job,
                                                                     static_cast<size_t>(clients));
  options.max_job_bytes = bench.max_job_bytes;
  return options;
}

RunResult run_once(const BenchOptions& bench, int n, int run, uint64_t& connection_serial) {
  ServerProcess server(server_options(bench, n));
  const double idle_kb = process_status_kb(server.pid(), "VmRSS");
  const double cpu_before = process_cpu_seconds(server.pid());
  server.reset_peak();
  const int processes = std::min(bench.client_processes, n);
  const auto begin = Clock::now();
  const auto deadline = begin + std::chrono::seconds(bench.timeout_s);
  const uint64_t serial = connection_serial;
  connection_serial += static_cast<uint64_t>(n);
  const auto outputs = run_forked_ranks(
      processes, std::chrono::seconds(bench.timeout_s + 10), "rendezvous_bench clients",
      [&](int p) {
        const int first = static_cast<int>(static_cast<int64_t>(n) * p / processes);
        const int end = static_cast<int>(static_cast<int64_t>(n) * (p + 1) / processes);
        const auto t = hsgd::bench::run_fleet({.port = server.port(),
                                               .job = "bench-" + std::to_string(run),
                                               .world = n,
                                               .first = first,
                                               .count = end - first,
                                               .value_bytes = bench.value_bytes,
                                               .check = bench.check,
                                               .connection_serial = serial + first,
                                               .max_connecting = bench.max_connecting,
                                               .max_waiting = bench.max_waiting,
                                               .deadline = deadline});
        rusage usage{};
        ::getrusage(RUSAGE_SELF, &usage);
        const double cpu =
            static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
            1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
        return std::to_string(t.last_connected.time_since_epoch().count()) + " " +
               std::to_string(t.last_done.time_since_epoch().count()) + " " + std::to_string(cpu);
      });
  Clock::time_point connected{}, done{};
  double clients_cpu = 0;
  for (const std::string& out : outputs) {
    std::istringstream in(out);
    int64_t c = 0, d = 0;
    double cpu = 0;
    HSGD_CHECK(static_cast<bool>(in >> c >> d >> cpu),
               "rendezvous_bench: a client process printed '", out, "'");
    connected = std::max(connected, Clock::time_point(Clock::duration(c)));
    done = std::max(done, Clock::time_point(Clock::duration(d)));
    clients_cpu += cpu;
  }
  const double peak_kb = process_status_kb(server.pid(), "VmHWM");
  return {.total = std::chrono::duration<double>(done - begin).count(),
          .connected = std::chrono::duration<double>(connected - begin).count(),
          .server_cpu = process_cpu_seconds(server.pid()) - cpu_before,
          .clients_cpu = clients_cpu,
          .server_peak_mb = peak_kb / 1024.0,
          .server_kb_per_client = (peak_kb - idle_kb) / n};
}

template <typename F>
double median_of(const std::vector<RunResult>& runs, F field) {
  std::vector<double> values;
  for (const RunResult& r : runs) values.push_back(field(r));
  return median(values);
}

void print_row(int n, const std::vector<RunResult>& runs) {
  std::vector<double> totals;
  for (const RunResult& r : runs) totals.push_back(r.total);
  std::printf("%8d %10.3f %8.3f %8.3f %14.3f %14.2f %14.2f %14.1f %14.2f\n", n, median(totals),
              *std::min_element(totals.begin(), totals.end()),
              *std::max_element(totals.begin(), totals.end()),
              median_of(runs, [](const RunResult& r) { return r.connected; }),
              median_of(runs, [](const RunResult& r) { return r.server_cpu; }),
              median_of(runs, [](const RunResult& r) { return r.clients_cpu; }),
              median_of(runs, [](const RunResult& r) { return r.server_peak_mb; }),
              median_of(runs, [](const RunResult& r) { return r.server_kb_per_client; }));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"rendezvous_bench: N clients publish a key and wait for all others"};
  std::vector<int> clients = {1024, 2048, 4096, 8192, 16384};
  BenchOptions bench;
  std::string check = "bytes";
  app.add_option("--clients", clients, "client counts to measure")->delimiter(',');
  app.add_option("--runs", bench.runs, "runs per client count (medians are reported)")
      ->check(CLI::PositiveNumber);
  app.add_option("--value-bytes", bench.value_bytes, "size of each published value")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--client-processes", bench.client_processes,
                 "processes the clients are spread over (one epoll thread each)")
      ->check(CLI::Range(1, 64));
  app.add_option("--check", check,
                 "bytes: compare each reply with the expected frame as it streams in; "
                 "protobuf: parse each reply whole and compare its values")
      ->check(CLI::IsMember({"bytes", "protobuf"}));
  app.add_option("--max-connecting", bench.max_connecting,
                 "connections opened and not yet through their handshake, per client process "
                 "(0: all at once)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-waiting", bench.max_waiting,
                 "clients with a multi_get sent and not yet answered, per client process "
                 "(0: all at once)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--server-threads", bench.server_threads, "I/O threads of the server")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-waits-per-job", bench.max_waits_per_job,
                 "the server's quota of pending waits per job (0: the number of clients)");
  app.add_option("--max-job-bytes", bench.max_job_bytes, "the server's byte quota per job");
  app.add_option("--timeout", bench.timeout_s, "seconds one run may take")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  bench.check =
      check == "bytes" ? hsgd::bench::FleetCheck::kBytes : hsgd::bench::FleetCheck::kProtobuf;

  try {
    raise_fd_limit(static_cast<size_t>(*std::max_element(clients.begin(), clients.end())));
    std::printf(
        "rendezvous_bench: %u hardware threads, server process with %d I/O thread(s), "
        "%d client process(es), %zu-byte values, check %s, at most %d connecting and %d "
        "waiting per client process (0: all), median of %d runs\n",
        std::thread::hardware_concurrency(), bench.server_threads, bench.client_processes,
        bench.value_bytes, check.c_str(), bench.max_connecting, bench.max_waiting, bench.runs);
    std::printf("%8s %10s %8s %8s %14s %14s %14s %14s %14s\n", "clients", "median [s]", "min [s]",
                "max [s]", "connected [s]", "server CPU [s]", "client CPU [s]", "server peak MB",
                "KB per client");
    uint64_t connection_serial = 0;
    int run = 0;
    for (int n : clients) {
      HSGD_CHECK(n >= 1, "rendezvous_bench: --clients ", n, " must be at least 1");
      std::vector<RunResult> runs;
      for (int r = 0; r < bench.runs; ++r)
        runs.push_back(run_once(bench, n, run++, connection_serial));
      print_row(n, runs);
    }
  } catch (const hsgd::Error& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
  return 0;
}
