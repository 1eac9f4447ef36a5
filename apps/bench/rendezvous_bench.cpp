// rendezvous_bench: N clients each publish a key and wait for everybody's (the pattern Gloo's
// connectFullMesh uses), against an embedded RendezvousServer; prints N vs seconds.
//
//   rendezvous_bench [--clients 64,128,256,512,1024] [--runs 5] [--server-threads 1]
//                    [--value-bytes 64]
//
// One run = every client thread connects (TcpStore: connect + handshake), sets "rank<i>", then
// multi_get()s all N keys, which the server answers once the last key arrives. The time is from
// releasing all threads together until the last one has every value. The table gives the median
// (bench_util.h), min and max over --runs runs, and the median time by which the last client had
// connected. Each client is a thread of
// this process (blocking API), so N = 1024 means 1024 threads and 2048 sockets.

#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "apps/bench/bench_util.h"
#include "comm/error.h"
#include "comm/rendezvous/rendezvous_server.h"
#include "comm/rendezvous/tcp_store.h"

namespace {

using Clock = std::chrono::steady_clock;
using hsgd::comm::Bytes;

// 2 sockets per client (both ends live in this process) plus headroom.
void raise_fd_limit(size_t clients) {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  getrlimit(RLIMIT_NOFILE, &limit);
  HSGD_CHECK(limit.rlim_cur >= 2 * clients + 64, "rendezvous_bench: ", clients,
             " clients need about ", 2 * clients + 64, " file descriptors, the limit is ",
             limit.rlim_cur, " (raise ulimit -Hn)");
}

struct RunTimes {
  double connected;  // until the last client finished its handshake
  double total;      // until the last client had every value
};

// One rendezvous of n clients on job `job`.
RunTimes run_once(int port, int n, const std::string& job, size_t value_bytes) {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) keys.push_back("rank" + std::to_string(i));
  std::barrier start(n + 1);
  std::atomic<int> failures = 0;
  std::vector<std::string> errors(n);
  std::vector<Clock::time_point> connected(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      try {
        hsgd::comm::TcpStore store({.port = port,
                                    .job_id = job,
                                    .connect_timeout = std::chrono::seconds(60),
                                    .timeout = std::chrono::seconds(60),
                                    // Measures the server: no journal thread per client.
                                    .republish = false});
        connected[i] = Clock::now();
        store.set(keys[i], Bytes(value_bytes, static_cast<uint8_t>(i)));
        auto values = store.multi_get(keys, std::chrono::seconds(120));
        for (int j = 0; j < n; ++j) {
          HSGD_CHECK(values[j].size() == value_bytes && values[j][0] == static_cast<uint8_t>(j),
                     "client ", i, " read a wrong value for ", keys[j]);
        }
      } catch (const std::exception& e) {
        ++failures;
        errors[i] = e.what();
      }
    });
  }
  const auto begin = Clock::now();
  start.arrive_and_wait();
  for (auto& t : threads) t.join();
  const auto end = Clock::now();
  const auto last_connected = *std::max_element(connected.begin(), connected.end());
  for (int i = 0; i < n; ++i) {
    if (!errors[i].empty()) {
      HSGD_THROW(hsgd::CommError, "rendezvous_bench: ", failures.load(), " of ", n,
                 " clients failed; client ", i, ": ", errors[i]);
    }
  }
  return {.connected = std::chrono::duration<double>(last_connected - begin).count(),
          .total = std::chrono::duration<double>(end - begin).count()};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"rendezvous_bench: N clients publish a key and wait for all others"};
  std::vector<int> clients = {64, 128, 256, 512, 1024};
  int runs = 5;
  int server_threads = 1;
  size_t value_bytes = 64;
  app.add_option("--clients", clients, "client counts to measure")->delimiter(',');
  app.add_option("--runs", runs, "runs per client count (the median is reported)")
      ->check(CLI::PositiveNumber);
  app.add_option("--server-threads", server_threads, "I/O threads of the server")
      ->check(CLI::PositiveNumber);
  app.add_option("--value-bytes", value_bytes, "size of each published value")
      ->check(CLI::Range(1, 1 << 20));
  CLI11_PARSE(app, argc, argv);

  try {
    raise_fd_limit(static_cast<size_t>(*std::max_element(clients.begin(), clients.end())));
    hsgd::comm::RendezvousServer server({.port = 0, .threads = server_threads});
    server.start();
    std::printf(
        "rendezvous_bench: %u hardware threads, server with %d I/O thread(s), "
        "%zu-byte values, median of %d runs\n",
        std::thread::hardware_concurrency(), server_threads, value_bytes, runs);
    std::printf("%8s %12s %12s %12s %20s\n", "clients", "median [s]", "min [s]", "max [s]",
                "median connected [s]");
    int job = 0;
    for (int n : clients) {
      std::vector<RunTimes> times;
      for (int r = 0; r < runs; ++r) {
        times.push_back(run_once(server.port(), n, "bench-" + std::to_string(job++), value_bytes));
      }
      std::vector<double> total, connected;
      for (const RunTimes& t : times) {
        total.push_back(t.total);
        connected.push_back(t.connected);
      }
      std::printf("%8d %12.3f %12.3f %12.3f %20.3f\n", n, median(total),
                  *std::min_element(total.begin(), total.end()),
                  *std::max_element(total.begin(), total.end()), median(connected));
      std::fflush(stdout);
    }
  } catch (const hsgd::Error& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
  return 0;
}
