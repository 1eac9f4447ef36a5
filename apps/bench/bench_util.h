#pragma once
// What every benchmark under apps/bench/ shares: the median its tables report, a runner that forks
// ranks (or one measurement) with a deadline, the call of a PyTorch script whose results come
// back as "RESULT ..." lines, and the names of the allreduce algorithms a benchmark may force.
//
// Usage:
//   const std::vector<std::string> out = run_forked_ranks(2, std::chrono::minutes(1), "demo",
//       [](int rank) { return std::to_string(rank * 10); });
//   const double m = median({std::stod(out[0]), std::stod(out[1])});  // 5
//
//   for (const auto& fields : run_python_results("apps/bench/ddp_bench_torch.py",
//                                                 {"--model", "mlp", "--world", "2"}, 600)) {
//     const double ms = std::stod(fields.at(0));
//   }

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "comm/error.h"
#include "comm/process_group/process_group.h"

// The median of `values`: the middle value of an odd count, the mean of the two middle values of
// an even count (Python's statistics.median, which the PyTorch scripts use). Throws
// hsgd::InvalidArgument for an empty vector.
double median(std::vector<double> values);

// Runs body(rank) for rank 0..world-1, each in a forked child, and returns what each body
// returned, by rank. Call it while this process has no other threads (fork copies only the
// calling thread); create process groups inside body. A child whose body throws prints
// "rank R: MESSAGE" to stderr and exits 1. Throws hsgd::Error naming `name` when a child fails or
// dies, or when `timeout` passes; at the deadline every child still running is killed (SIGKILL,
// by pid), so nothing is left running.
std::vector<std::string> run_forked_ranks(int world, std::chrono::steady_clock::duration timeout,
                                          const std::string& name,
                                          const std::function<std::string(int rank)>& body);

// Runs `timeout TIMEOUT_S /usr/bin/python3 SCRIPT ARGS...` (each argument quoted for the shell,
// stderr merged into stdout) and returns the fields after "RESULT" of every line that starts with
// "RESULT ", in order. Throws hsgd::Error naming the command, with its output, when it cannot be
// started, exits non-zero (timeout(1) exits 124) or prints no RESULT line.
std::vector<std::vector<std::string>> run_python_results(const std::string& script,
                                                         const std::vector<std::string>& args,
                                                         int timeout_s);

// One field of /proc/PID/status in kB ("VmRSS", "VmHWM"); -1 when it cannot be read.
double process_status_kb(pid_t pid, const std::string& field);

// A training step's measurement: the median step and the peak resident memory above what the
// process held before it built the model.
struct StepMeasurement {
  double step_ms = 0;
  double peak_mb = 0;
};

// Parses the fields "STEP_MS PEAK_MB" (a forked child's answer, or a PyTorch script's RESULT
// line). Throws hsgd::Error naming `what` unless there are two fields and the step is positive.
StepMeasurement parse_step_measurement(const std::vector<std::string>& fields,
                                       const std::string& what);

// Runs measure() in a forked child (run_forked_ranks, 900 s) and returns its measurement. Throws
// hsgd::Error naming `what` when the child fails or times out.
StepMeasurement measure_in_child(const std::string& what,
                                 const std::function<StepMeasurement()>& measure);

// The CPU's model name (/proc/cpuinfo), for the benchmarks' first line; "unknown" when absent.
std::string cpu_model();

// Resets this process's peak resident memory (VmHWM) to its current resident size (Linux >= 4.0)
// and returns that size in MB: a measurement's peak is process_status_kb(getpid(), "VmHWM") /
// 1024 minus it.
double reset_peak_rss_mb();

// User + system CPU seconds of process pid so far (/proc/PID/stat); -1 when it cannot be read.
double process_cpu_seconds(pid_t pid);
