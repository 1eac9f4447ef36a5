// launcher_test_worker: the worker program the hsgd-run tests launch.
//   launcher_test_worker allreduce [DIR]   allreduce RANK over the world group, check the sum
//   launcher_test_worker env DIR           check the torchrun variables, record them in DIR
//   launcher_test_worker fail-once DIR     rank 1 exits 7 in attempt 0; every run is recorded
//   launcher_test_worker always-fail       rank 1 exits 3 after printing a marker; others sleep
//   launcher_test_worker sleep DIR [ignore-term|report]  record pid in DIR, print "ready",
//                                          sleep 60 s; "report" prints the signal that stops it
//   launcher_test_worker steps DIR N [stop|loop|exit] [FAIL_STEP]  N training-like steps
//                                          (allreduce, then comm::report_progress(step)), resuming
//                                          from the step recorded in DIR; every 4 steps rank 0
//                                          records the step ("checkpoint"). In attempt 0, rank 2
//                                          stops itself (SIGSTOP), busy-loops, or exits 9 after
//                                          FAIL_STEP (default 6) steps
//   launcher_test_worker last-words DIR    print a line and a partial line, record that in DIR,
//                                          sleep 60 s
//   launcher_test_worker sleep-once DIR    attempt 0: record pid in DIR, print "ready", sleep
//                                          60 s; later attempts: print "attempt N done", exit 0
// Exit code 0 = checks passed; anything else = a failure hsgd-run must report.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "comm/process_group/init.h"
#include "comm/process_group/process_group.h"
#include "comm/process_group/worker_progress.h"

namespace {

// Async-signal-safe report of the signal hsgd-run forwarded, then exit.
void report_signal(int sig) {
  char msg[] = "got signal 00\n";
  char* end = msg + 11;  // after "got signal "
  if (sig >= 10) *end++ = static_cast<char>('0' + sig / 10);
  *end++ = static_cast<char>('0' + sig % 10);
  *end++ = '\n';
  (void)!write(STDOUT_FILENO, msg, static_cast<size_t>(end - msg));
  _exit(0);
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) {
    std::cerr << "missing environment variable " << name << std::endl;
    std::exit(20);
  }
  return std::atoi(v);
}

std::string env_str(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "<unset>";
}

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

void sleep_seconds(int s) { std::this_thread::sleep_for(std::chrono::seconds(s)); }

int check_env(const std::string& dir) {
  const int rank = env_int("RANK"), world = env_int("WORLD_SIZE");
  const int local = env_int("LOCAL_RANK"), local_world = env_int("LOCAL_WORLD_SIZE");
  const int group = env_int("GROUP_RANK"), restart = env_int("HSGD_RESTART_COUNT");
  env_int("MASTER_PORT");
  int bad = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::cerr << "env check failed: " << what << std::endl;
      ++bad;
    }
  };
  expect(rank >= 0 && rank < world, "RANK in [0, WORLD_SIZE)");
  expect(local >= 0 && local < local_world, "LOCAL_RANK in [0, LOCAL_WORLD_SIZE)");
  expect(rank == group * local_world + local, "RANK == GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK");
  if (local_world > 1) {
    expect(env_str("OMP_NUM_THREADS") == "1", "OMP_NUM_THREADS=1 with several workers");
    expect(env_str("HSGD_NUM_THREADS") == "1", "HSGD_NUM_THREADS=1 with several workers");
  }
  std::string record;
  for (const char* name :
       {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
        "MASTER_PORT", "HSGD_RUN_ID", "HSGD_RESTART_COUNT", "OMP_NUM_THREADS"}) {
    record += std::string(name) + "=" + env_str(name) + "\n";
  }
  write_file(dir + "/env_attempt" + std::to_string(restart) + "_rank" + std::to_string(rank),
             record);
  std::cout << "env ok" << std::endl;
  return bad == 0 ? 0 : 1;
}

int allreduce(const std::string& dir) {
  auto world = hsgd::comm::init_process_group(hsgd::comm::InitOptions::from_env());
  const int n = world->size();
  std::vector<float> value{static_cast<float>(world->rank()), 1.0f};
  world->allreduce(value, hsgd::comm::ReduceOp::kSum)->wait();
  const float expected = static_cast<float>(n * (n - 1) / 2);
  std::cout << "allreduce sum " << value[0] << " count " << value[1] << std::endl;
  if (value[0] != expected || value[1] != static_cast<float>(n)) {
    std::cerr << "allreduce: expected sum " << expected << " and count " << n << std::endl;
    return 1;
  }
  if (!dir.empty()) write_file(dir + "/allreduce_rank" + std::to_string(world->rank()), "ok\n");
  // Exit barrier over the store: a rank that exits while a peer still reads its last Gloo
  // message can reset the connection under it (seen here with 2 ranks), so leave together.
  auto store = world->store();
  const std::string key =
      "launcher_test_worker/exit/" + std::to_string(env_int("HSGD_RESTART_COUNT"));
  if (store->add(key, 1) == n) store->set(key + "/all", hsgd::comm::to_bytes("1"));
  store->wait({key + "/all"}, std::chrono::seconds(60));
  return 0;
}

// Records the token this worker was given (HSGD_RDZV_TOKEN) and HSGD_INSECURE, and every process
// whose command line holds the token (/proc/PID/cmdline is world-readable: there must be none),
// then runs allreduce(), whose store and process group need that token (or plain mode).
int check_secrets(const std::string& dir) {
  const char* given = std::getenv("HSGD_RDZV_TOKEN");
  const std::string token = given != nullptr ? given : "";
  std::string record =
      "token=" + env_str("HSGD_RDZV_TOKEN") + "\ninsecure=" + env_str("HSGD_INSECURE") + "\n";
  if (!token.empty()) {
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      std::ifstream in(entry.path() / "cmdline", std::ios::binary);
      const std::string cmdline((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
      if (cmdline.find(token) != std::string::npos) {
        record += "in the command line of " + entry.path().filename().string() + "\n";
      }
    }
  }
  write_file(dir + "/secrets_rank" + std::to_string(env_int("RANK")), record);
  return allreduce(dir);
}

std::string slurp_or(const std::string& path, const std::string& otherwise) {
  std::ifstream in(path);
  std::string text;
  return std::getline(in, text) ? text : otherwise;
}

// A training loop in miniature: one allreduce per step, progress reported after each, a
// "checkpoint" (the step, written by rank 0) every 4 steps, resumed from at start.
int steps(const std::string& dir, int n, const std::string& fault, int fail_step) {
  auto world = hsgd::comm::init_process_group(hsgd::comm::InitOptions::from_env());
  const int restart = env_int("HSGD_RESTART_COUNT");
  const int first = std::stoi(slurp_or(dir + "/checkpoint", "0"));
  hsgd::comm::report_progress(first);
  if (world->rank() == 0) std::cout << "resumed from step " << first << std::endl;
  for (int step = first + 1; step <= n; ++step) {
    std::vector<float> value{1.0f};
    world->allreduce(value, hsgd::comm::ReduceOp::kSum)->wait();
    if (value[0] != static_cast<float>(world->size())) return 1;
    hsgd::comm::report_progress(step);
    if (world->rank() == 0) std::cout << "step " << step << std::endl;
    if (world->rank() == 0 && step % 4 == 0) {
      write_file(dir + "/checkpoint.tmp", std::to_string(step) + "\n");
      std::rename((dir + "/checkpoint.tmp").c_str(), (dir + "/checkpoint").c_str());
    }
    if (restart == 0 && world->rank() == 2 && step == fail_step) {
      std::cout << "rank 2 goes silent after step " << step << " (" << fault << ")" << std::endl;
      if (fault == "stop") raise(SIGSTOP);
      if (fault == "exit") return 9;
      if (fault == "loop") {
        std::atomic<uint64_t> spin{0};  // a busy loop the compiler may not remove
        for (;;) spin.fetch_add(1, std::memory_order_relaxed);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  world->barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const std::string dir = argc > 2 ? argv[2] : "";
  try {
    if (mode == "allreduce") return allreduce(dir);
    if (mode == "env") return check_env(dir);
    if (mode == "secrets") return check_secrets(dir);
    if (mode == "fail-once") {
      const int rank = env_int("RANK"), restart = env_int("HSGD_RESTART_COUNT");
      write_file(dir + "/ran_attempt" + std::to_string(restart) + "_rank" + std::to_string(rank),
                 "HSGD_RESTART_COUNT=" + std::to_string(restart) + "\n");
      if (restart == 0 && rank == 1) {
        std::cerr << "failing on purpose in attempt 0" << std::endl;
        return 7;
      }
      if (restart == 0) sleep_seconds(60);  // stopped by hsgd-run when rank 1 fails
      return 0;
    }
    if (mode == "always-fail") {
      if (env_int("RANK") == 1) {
        std::cout << "about to fail" << std::endl;
        std::cerr << "boom: rank 1 gives up" << std::endl;
        return 3;
      }
      sleep_seconds(60);
      return 0;
    }
    if (mode == "steps") {
      return steps(dir, std::stoi(argv[3]), argc > 4 ? argv[4] : "",
                   argc > 5 ? std::stoi(argv[5]) : 6);
    }
    if (mode == "last-words") {
      std::cout << "last words before the end" << std::endl;
      std::cout << "partial line at the end" << std::flush;
      write_file(dir + "/printed_rank" + std::to_string(env_int("RANK")), "both written\n");
      sleep_seconds(60);
      return 0;
    }
    if (mode == "sleep-once") {
      const int rank = env_int("RANK"), restart = env_int("HSGD_RESTART_COUNT");
      if (restart > 0) {
        std::cout << "attempt " << restart << " done" << std::endl;
        return 0;
      }
      write_file(dir + "/pid_rank" + std::to_string(rank), std::to_string(getpid()) + "\n");
      std::cout << "ready" << std::endl;
      sleep_seconds(60);
      return 0;
    }
    if (mode == "sleep") {
      const std::string how = argc > 3 ? argv[3] : "";
      if (how == "ignore-term") signal(SIGTERM, SIG_IGN);
      if (how == "report") {
        signal(SIGTERM, report_signal);
        signal(SIGINT, report_signal);
      }
      write_file(dir + "/pid_rank" + std::to_string(env_int("RANK")),
                 std::to_string(getpid()) + "\n");
      std::cout << "ready" << std::endl;
      sleep_seconds(60);
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "launcher_test_worker: " << e.what() << std::endl;
    return 10;
  }
  std::cerr << "launcher_test_worker: unknown mode '" << mode << "'" << std::endl;
  return 2;
}
