// resnet_step_bench: the training step of ResNet-20 and of the MLP in hsgd and in PyTorch on this
// machine, at 1 and 2 threads and batch 32 and 128, and (--ops) the time of each op kind at
// ResNet-20's shapes in both, to show which op dominates.
//
//   resnet_step_bench                                 # the table of issue 11: about 10 minutes
//   resnet_step_bench --models resnet20 --batches 32 --threads 1 --rounds 1
//   resnet_step_bench --ops --no-torch
//
// A training step is zero_grad, forward, cross_entropy, backward and SGD (momentum 0.9, weight
// decay 1e-4) on a fixed random batch. Every measurement runs in a fresh process (hsgd: a forked
// child; PyTorch: resnet_step_bench_torch.py under /usr/bin/python3) that builds the model, takes
// --warmup untimed steps and --steps timed ones, and reports the median step and its peak
// resident memory above what the process held before it built the model. The two alternate, one
// configuration at a time, for --rounds rounds; the table shows the median over the rounds (the
// machine is shared and noisy). "threads" is hsgd::set_num_threads (the pool and OpenBLAS) and
// torch.set_num_threads. GFLOP/s counts a training step as 3x the multiply-adds x 2 of the
// forward convolutions and linear layers (the usual convention: the backward pass does twice the
// forward's work), and "peak %" relates it to OpenBLAS sgemm on a 1536 x 1536 product measured
// here at the same thread count.

#include <cblas.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/nn/functional.h"
#include "framework/parallel/parallel.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"
#include "models/registry.h"
#include "optim/sgd.h"

extern "C" char* openblas_get_corename(void);

namespace {

using namespace hsgd;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  HSGD_CHECK(!v.empty(), "median of no values");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double best(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

// ---- one measurement ----

struct Config {
  std::string model;
  int64_t batch = 0;
  int threads = 1;
};

std::string describe(const Config& c) {
  return c.model + " batch " + std::to_string(c.batch) + " threads " + std::to_string(c.threads);
}

struct Measurement {
  double step_ms = 0;  // median step
  double peak_mb = 0;  // peak resident memory above the process's before the model was built
};

// Resident memory of this process: VmRSS or VmHWM (peak) from /proc/self/status, in MB.
double status_mb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(std::strlen(field) + 1)) / 1024.0;
  }
  return 0;
}

// Resets VmHWM to the current resident size (Linux >= 4.0); returns that size in MB.
double reset_peak_mb() {
  std::ofstream("/proc/self/clear_refs") << "5";
  return status_mb("VmRSS:");
}

Shape input_shape(const std::string& model) {
  return model == "mlp" ? Shape{1, 28, 28} : Shape{3, 32, 32};
}

// Multiply-adds x 2 of one forward pass of one sample.
double forward_flops_per_sample(const std::string& model);

// Runs in a forked child: build, warm up, time --steps steps.
Measurement hsgd_measure(const Config& c, int warmup, int steps) {
  set_num_threads(c.threads);
  const double before = reset_peak_mb();
  const Shape in = input_shape(c.model);
  auto model = models::make_model(c.model, {.input_shape = in, .seed = 0});
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
  Generator gen(1);
  Shape x_shape = {c.batch};
  x_shape.insert(x_shape.end(), in.begin(), in.end());
  const Tensor x = randn(x_shape, gen);  // (B, C, H, W)
  std::vector<int64_t> targets;
  for (int64_t i = 0; i < c.batch; ++i) targets.push_back(static_cast<int64_t>(gen.next_below(10)));
  std::vector<double> times;
  for (int i = 0; i < warmup + steps; ++i) {
    const auto t0 = Clock::now();
    opt.zero_grad();
    nn::cross_entropy(model->forward(x), targets).backward();
    opt.step();
    if (i >= warmup) times.push_back(1e3 * seconds_since(t0));
  }
  return {median(times), status_mb("VmHWM:") - before};
}

// Runs fn in a forked child and returns what it prints to the pipe; kills the child and throws
// when it takes longer than timeout_s.
std::string run_in_child(const std::function<std::string()>& fn, int timeout_s,
                         const std::string& what) {
  int fds[2];
  HSGD_CHECK(pipe(fds) == 0, "pipe failed");
  std::fflush(stdout);
  const pid_t pid = fork();
  HSGD_CHECK(pid >= 0, "fork failed");
  if (pid == 0) {
    close(fds[0]);
    int code = 0;
    std::string out;
    try {
      out = fn();
    } catch (const std::exception& e) {
      out = std::string("error ") + e.what();
      code = 1;
    }
    (void)!write(fds[1], out.data(), out.size());
    _exit(code);
  }
  close(fds[1]);
  std::string out;
  const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  char buf[4096];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{fds[0], POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      close(fds[0]);
      HSGD_THROW(Error, what, ": no result after ", timeout_s, " s; killed");
    }
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  HSGD_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, what, " failed: ", out);
  return out;
}

Measurement parse_measurement(const std::string& text, const std::string& what) {
  std::istringstream in(text);
  Measurement m;
  std::string key;
  bool step = false, peak = false;
  while (in >> key) {
    if (key == "step_ms") step = static_cast<bool>(in >> m.step_ms);
    if (key == "peak_mb") peak = static_cast<bool>(in >> m.peak_mb);
  }
  HSGD_CHECK(step && peak && m.step_ms > 0, what, ": no step_ms and peak_mb in '", text, "'");
  return m;
}

Measurement hsgd_run(const Config& c, int warmup, int steps) {
  const std::string what = "hsgd " + describe(c);
  const std::string out = run_in_child(
      [&] {
        const Measurement m = hsgd_measure(c, warmup, steps);
        std::ostringstream o;
        o << "step_ms " << m.step_ms << " peak_mb " << m.peak_mb;
        return o.str();
      },
      900, what);
  return parse_measurement(out, what);
}

Measurement torch_run(const std::string& script, const Config& c, int warmup, int steps) {
  // timeout(1) bounds the child: a benchmark must not hang either.
  const std::string cmd = "timeout 900 /usr/bin/python3 '" + script + "' --model " + c.model +
                          " --threads " + std::to_string(c.threads) + " --batch-size " +
                          std::to_string(c.batch) + " --warmup " + std::to_string(warmup) +
                          " --steps " + std::to_string(steps);
  FILE* pipe = popen(cmd.c_str(), "r");
  HSGD_CHECK(pipe != nullptr, "could not run '", cmd, "'");
  std::string out;
  char line[512];
  while (std::fgets(line, sizeof line, pipe) != nullptr) out += line;
  const int status = pclose(pipe);
  HSGD_CHECK(status == 0, "'", cmd, "' failed (status ", status, "): ", out);
  return parse_measurement(out, cmd);
}

// OpenBLAS sgemm on an n x n product at the current thread count, best of 3, in GFLOP/s.
double sgemm_gflops(int threads) {
  set_num_threads(threads);
  constexpr int n = 1536;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  std::vector<double> t;
  for (int r = 0; r < 4; ++r) {
    const auto start = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    if (r > 0) t.push_back(seconds_since(start));
  }
  return 2.0 * n * n * n / best(t) / 1e9;
}

// ---- per-op timing at ResNet-20's shapes (same list as resnet_step_bench_torch.py) ----

struct OpSpec {
  std::string kind;                         // conv, batch_norm, relu, add
  int64_t cin, cout, k, stride, hw, count;  // non-conv ops use cin (channels), hw and count
};

const std::vector<OpSpec> kResNet20Ops = {
    {"conv", 3, 16, 3, 1, 32, 1},       {"conv", 16, 16, 3, 1, 32, 6},
    {"conv", 16, 32, 3, 2, 32, 1},      {"conv", 32, 32, 3, 1, 16, 5},
    {"conv", 16, 32, 1, 2, 32, 1},      {"conv", 32, 64, 3, 2, 16, 1},
    {"conv", 64, 64, 3, 1, 8, 5},       {"conv", 32, 64, 1, 2, 16, 1},
    {"batch_norm", 16, 0, 0, 0, 32, 7}, {"batch_norm", 32, 0, 0, 0, 16, 7},
    {"batch_norm", 64, 0, 0, 0, 8, 7},  {"relu", 16, 0, 0, 0, 32, 7},
    {"relu", 32, 0, 0, 0, 16, 6},       {"relu", 64, 0, 0, 0, 8, 6},
    {"add", 16, 0, 0, 0, 32, 3},        {"add", 32, 0, 0, 0, 16, 3},
    {"add", 64, 0, 0, 0, 8, 3},
};

std::string op_name(const OpSpec& s) {
  std::ostringstream out;
  if (s.kind == "conv") {
    out << "conv" << s.k << "x" << s.k << "_" << s.cin << "_" << s.cout << "_s" << s.stride << "_"
        << s.hw << "px";
  } else {
    out << s.kind << "_" << s.cin << "_" << s.hw << "px";
  }
  return out.str();
}

struct OpTime {
  double fwd_ms = 0, bwd_ms = 0;
  int64_t count = 0;
};

double best_time(const std::function<void()>& fn, int reps) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    fn();
    t.push_back(seconds_since(start));
  }
  return best(t);
}

std::map<std::string, OpTime> hsgd_op_times(int64_t n, int reps) {
  std::map<std::string, OpTime> out;
  Generator gen(2);
  for (const OpSpec& s : kResNet20Ops) {
    Tensor x = randn({n, s.cin, s.hw, s.hw}, gen).set_requires_grad(true);  // (N,C,H,W)
    std::function<Tensor()> f;
    if (s.kind == "conv") {
      Tensor w = randn({s.cout, s.cin, s.k, s.k}, gen).set_requires_grad(true);
      const Size2 stride = {s.stride, s.stride}, pad = {s.k / 2, s.k / 2};
      f = [x, w, stride, pad] { return conv2d(x, w, Tensor(), stride, pad); };
    } else if (s.kind == "batch_norm") {
      Tensor wt = ones({s.cin}).set_requires_grad(true), b = zeros({s.cin}).set_requires_grad(true);
      Tensor rm = zeros({s.cin}), rv = ones({s.cin});
      f = [x, wt, b, rm, rv] { return batch_norm(x, wt, b, rm, rv, true, 0.1, 1e-5); };
    } else if (s.kind == "relu") {
      f = [x] { return relu(x); };
    } else {
      Tensor x2 = randn(x.shape(), gen).set_requires_grad(true);
      f = [x, x2] { return add(x, x2); };
    }
    const Tensor g = randn(f().shape(), gen);
    const double fwd = best_time([&] { f(); }, reps);
    const double both = best_time([&] { f().backward(g); }, reps);
    out[op_name(s)] = {1e3 * fwd, 1e3 * (both - fwd), s.count};
  }
  return out;
}

// ---- flop counts ----

double forward_flops_per_sample(const std::string& model) {
  if (model == "mlp") return 2.0 * (784.0 * 512 + 512.0 * 256 + 256.0 * 10);
  HSGD_CHECK(model == "resnet20", "GFLOP/s is counted for resnet20 and mlp only, not '", model,
             "'");
  double flops = 2.0 * 64 * 10;  // the classifier
  for (const OpSpec& s : kResNet20Ops) {
    if (s.kind != "conv") continue;
    const double out_hw = static_cast<double>(s.hw / s.stride);
    flops += 2.0 * s.cin * s.cout * s.k * s.k * out_hw * out_hw * static_cast<double>(s.count);
  }
  return flops;
}

// ---- the PyTorch op table ----

std::map<std::string, OpTime> torch_op_times(const std::string& script, int64_t batch, int reps,
                                             int threads) {
  const std::string cmd = "timeout 900 /usr/bin/python3 '" + script + "' --threads " +
                          std::to_string(threads) + " --ops-only --batch-size " +
                          std::to_string(batch) + " --op-reps " + std::to_string(reps);
  FILE* pipe = popen(cmd.c_str(), "r");
  HSGD_CHECK(pipe != nullptr, "could not run '", cmd, "'");
  std::map<std::string, OpTime> ops;
  char line[512];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    std::istringstream in(line);
    std::string key, name;
    OpTime t;
    if (in >> key >> name >> t.fwd_ms >> t.bwd_ms >> t.count && key == "op") ops[name] = t;
  }
  const int status = pclose(pipe);
  HSGD_CHECK(status == 0 && !ops.empty(), "'", cmd, "' failed (status ", status, ")");
  return ops;
}

void print_op_table(const std::string& script, int64_t batch, int reps, bool no_torch,
                    int threads) {
  set_num_threads(threads);
  const std::map<std::string, OpTime> ours = hsgd_op_times(batch, reps);
  const std::map<std::string, OpTime> theirs =
      no_torch ? std::map<std::string, OpTime>{} : torch_op_times(script, batch, reps, threads);
  std::printf(
      "\nper op at ResNet-20 shapes, batch %lld, %d thread%s, ms per call (x count = per "
      "step; hsgd's backward includes accumulating the leaves' .grad, torch's "
      "autograd.grad does not):\n",
      static_cast<long long>(batch), threads, threads == 1 ? "" : "s");
  std::printf("%-24s %5s %9s %9s %9s %9s %10s %10s %7s\n", "op", "count", "hsgd_fwd", "hsgd_bwd",
              "torch_fwd", "torch_bwd", "hsgd_step", "torch_step", "time_x");
  double total_ours = 0, total_torch = 0;
  for (const OpSpec& s : kResNet20Ops) {
    const std::string name = op_name(s);
    const OpTime& o = ours.at(name);
    const double per_step = (o.fwd_ms + o.bwd_ms) * static_cast<double>(o.count);
    total_ours += per_step;
    auto it = theirs.find(name);
    if (it == theirs.end()) {
      std::printf("%-24s %5lld %9.2f %9.2f %9s %9s %10.1f %10s %7s\n", name.c_str(),
                  static_cast<long long>(o.count), o.fwd_ms, o.bwd_ms, "-", "-", per_step, "-",
                  "-");
      continue;
    }
    const OpTime& t = it->second;
    const double torch_step = (t.fwd_ms + t.bwd_ms) * static_cast<double>(t.count);
    total_torch += torch_step;
    std::printf("%-24s %5lld %9.2f %9.2f %9.2f %9.2f %10.1f %10.1f %7.2f\n", name.c_str(),
                static_cast<long long>(o.count), o.fwd_ms, o.bwd_ms, t.fwd_ms, t.bwd_ms, per_step,
                torch_step, torch_step > 0 ? per_step / torch_step : 0.0);
  }
  std::printf("%-24s %5s %9s %9s %9s %9s %10.1f %10.1f %7.2f\n", "total", "", "", "", "", "",
              total_ours, total_torch, total_torch > 0 ? total_ours / total_torch : 0.0);
}

template <typename T>
std::vector<T> parse_list(const std::string& text, const char* flag) {
  std::vector<T> out;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::istringstream one(item);
    T v{};
    HSGD_CHECK(static_cast<bool>(one >> v) && one.eof(), flag, ": '", item, "' in '", text,
               "' is not a valid entry");
    out.push_back(v);
  }
  HSGD_CHECK(!out.empty(), flag, ": empty list");
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string models_text = "resnet20,mlp", batches_text = "32,128", threads_text = "1,2";
  int rounds = 3, steps = 4, warmup = 2, reps = 5;
  int64_t op_batch = 32;
  int op_threads = 1;
  bool no_torch = false, ops = false;
  std::string script = HSGD_BENCH_DIR "/resnet_step_bench_torch.py";
  CLI::App app{"Training-step time of ResNet-20 and the MLP: hsgd vs PyTorch."};
  app.add_option("--models", models_text, "Comma-separated: resnet20, mlp")->capture_default_str();
  app.add_option("--batches", batches_text, "Comma-separated batch sizes")->capture_default_str();
  app.add_option("--threads", threads_text, "Comma-separated thread counts")->capture_default_str();
  app.add_option("--rounds", rounds, "Rounds alternating hsgd and PyTorch (median reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_option("--steps", steps, "Timed steps per measurement (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--warmup", warmup, "Untimed steps first")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  app.add_flag("--no-torch", no_torch, "Skip PyTorch");
  app.add_flag("--ops", ops, "Also print the per-op table (at --op-threads)");
  app.add_option("--op-batch", op_batch, "Batch size of the op table")->capture_default_str();
  app.add_option("--op-threads", op_threads, "Thread count of the op table")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--op-reps", reps, "Repetitions per op in the op table (best)")
      ->capture_default_str();
  app.add_option("--torch-script", script, "Path of resnet_step_bench_torch.py")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    const auto model_list = parse_list<std::string>(models_text, "--models");
    const auto batch_list = parse_list<int64_t>(batches_text, "--batches");
    const auto thread_list = parse_list<int>(threads_text, "--threads");
    for (int t : thread_list)
      HSGD_CHECK(t >= 1, "--threads: ", t, " in '", threads_text, "' must be at least 1");
    for (int64_t b : batch_list)
      HSGD_CHECK(b >= 1, "--batches: ", b, " in '", batches_text, "' must be at least 1");
    for (const auto& m : model_list) forward_flops_per_sample(m);  // rejects unknown models early
    std::map<int, double> peak;
    for (int t : thread_list) peak[t] = sgemm_gflops(t);
    std::printf(
        "resnet_step_bench: OpenBLAS core %s; median of %d rounds x %d steps (after %d "
        "warm-up)\n",
        openblas_get_corename(), rounds, steps, warmup);
    for (int t : thread_list) {
      std::printf("sgemm 1536^3 at %d thread%s: %.1f GFLOP/s\n", t, t == 1 ? "" : "s", peak[t]);
    }

    std::vector<Config> configs;
    for (const auto& m : model_list) {
      for (int64_t b : batch_list) {
        for (int t : thread_list) configs.push_back({m, b, t});
      }
    }
    std::map<std::string, std::vector<Measurement>> ours, theirs;
    for (int r = 0; r < rounds; ++r) {
      for (const Config& c : configs) {
        ours[describe(c)].push_back(hsgd_run(c, warmup, steps));
        if (!no_torch) theirs[describe(c)].push_back(torch_run(script, c, warmup, steps));
      }
      std::fprintf(stderr, "round %d of %d done\n", r + 1, rounds);
    }

    auto med = [](const std::vector<Measurement>& v, double Measurement::*field) {
      std::vector<double> x;
      for (const auto& m : v) x.push_back(m.*field);
      return median(x);
    };
    std::printf("\n%-9s %5s %7s %9s %9s %8s %8s %7s %9s %9s\n", "model", "batch", "threads",
                "hsgd_ms", "torch_ms", "time_x", "GFLOP/s", "peak%", "hsgd_MB", "torch_MB");
    std::map<std::string, double> ms;
    for (const Config& c : configs) {
      const auto& o = ours[describe(c)];
      const double h_ms = med(o, &Measurement::step_ms), h_mb = med(o, &Measurement::peak_mb);
      ms["hsgd " + describe(c)] = h_ms;
      const double gflops =
          3.0 * forward_flops_per_sample(c.model) * static_cast<double>(c.batch) / h_ms / 1e6;
      if (no_torch) {
        std::printf("%-9s %5lld %7d %9.1f %9s %8s %8.1f %6.0f%% %9.1f %9s\n", c.model.c_str(),
                    static_cast<long long>(c.batch), c.threads, h_ms, "-", "-", gflops,
                    100.0 * gflops / peak[c.threads], h_mb, "-");
        continue;
      }
      const auto& t = theirs[describe(c)];
      const double t_ms = med(t, &Measurement::step_ms), t_mb = med(t, &Measurement::peak_mb);
      ms["torch " + describe(c)] = t_ms;
      std::printf("%-9s %5lld %7d %9.1f %9.1f %8.2f %8.1f %6.0f%% %9.1f %9.1f\n", c.model.c_str(),
                  static_cast<long long>(c.batch), c.threads, h_ms, t_ms, h_ms / t_ms, gflops,
                  100.0 * gflops / peak[c.threads], h_mb, t_mb);
    }
    std::printf(
        "time_x = hsgd time / PyTorch time (< 1: hsgd faster); MB = peak RSS of a step "
        "above the process's before the model\n");
    if (thread_list.size() >= 2) {
      const int t0 = thread_list.front(), t1 = thread_list.back();
      std::printf("\nspeedup from %d to %d threads (time at %d / time at %d):\n", t0, t1, t0, t1);
      for (const auto& m : model_list) {
        for (int64_t b : batch_list) {
          const Config a{m, b, t0}, z{m, b, t1};
          std::printf("  %-9s batch %4lld: hsgd %.2fx", m.c_str(), static_cast<long long>(b),
                      ms["hsgd " + describe(a)] / ms["hsgd " + describe(z)]);
          if (!no_torch) {
            std::printf("  torch %.2fx", ms["torch " + describe(a)] / ms["torch " + describe(z)]);
          }
          std::printf("\n");
        }
      }
    }
    if (ops) print_op_table(script, op_batch, reps, no_torch, op_threads);
    return 0;
  } catch (const hsgd::Error& e) {
    std::fprintf(stderr, "resnet_step_bench: error: %s\n", e.what());
    return 1;
  }
}
