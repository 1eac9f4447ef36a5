// resnet_step_bench: training throughput of a ResNet (default ResNet-20, batch 128) in hsgd and in
// PyTorch on this machine, and the time of each op kind at ResNet-20's shapes in both, to show
// which op dominates.
//
//   resnet_step_bench                       # hsgd and torch at 1 and 2 threads, with the op table
//   resnet_step_bench --no-torch --steps 5
//
// A training step is zero_grad, forward, cross_entropy, backward and SGD (momentum 0.9, weight
// decay 1e-4) on a fixed random batch; the fastest of --steps timed steps is reported (the
// machine is shared; other jobs only add time). hsgd/torch is the throughput ratio (> 1: hsgd
// faster); in the op table time_x is hsgd time / torch time (> 1: hsgd slower). "threads" is
// OpenBLAS's thread count for hsgd (its other kernels are single-threaded) and
// torch.set_num_threads for PyTorch, which runs resnet_step_bench_torch.py under /usr/bin/python3.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/nn/functional.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"
#include "models/registry.h"
#include "optim/sgd.h"

extern "C" void openblas_set_num_threads(int num_threads);
extern "C" char* openblas_get_corename(void);

namespace {

using namespace hsgd;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The fastest of the timed runs: on a shared machine other jobs only ever add time, so the
// minimum is the best estimate of the cost of the work itself.
double best(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

struct StepResult {
  double step_s = 0, forward_s = 0, backward_s = 0, optimizer_s = 0;
};

StepResult hsgd_step_time(const std::string& model_name, int64_t batch, int warmup, int steps) {
  auto model = models::make_model(model_name, {.seed = 0});
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
  Generator gen(1);
  const Tensor x = randn({batch, 3, 32, 32}, gen);  // (B,3,32,32)
  std::vector<int64_t> targets;
  for (int64_t i = 0; i < batch; ++i) targets.push_back(static_cast<int64_t>(gen.next_below(10)));
  std::vector<double> step, fwd, bwd, upd;
  for (int i = 0; i < warmup + steps; ++i) {
    const auto t0 = Clock::now();
    opt.zero_grad();
    Tensor loss = nn::cross_entropy(model->forward(x), targets);
    const auto t1 = Clock::now();
    loss.backward();
    const auto t2 = Clock::now();
    opt.step();
    if (i < warmup) continue;
    step.push_back(seconds_since(t0));
    fwd.push_back(std::chrono::duration<double>(t1 - t0).count());
    bwd.push_back(std::chrono::duration<double>(t2 - t1).count());
    upd.push_back(seconds_since(t2));
  }
  return {best(step), best(fwd), best(bwd), best(upd)};
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

// ---- the PyTorch side ----

struct TorchResult {
  double images_per_s = 0;
  std::map<std::string, OpTime> ops;
};

TorchResult run_torch(const std::string& script, const std::string& model, int threads,
                      int64_t batch, int steps, bool ops, int reps) {
  // timeout(1) bounds the child: a benchmark must not hang either.
  const std::string cmd = "timeout 900 /usr/bin/python3 '" + script + "' --model " + model +
                          " --threads " + std::to_string(threads) + " --batch-size " +
                          std::to_string(batch) + " --steps " + std::to_string(steps) +
                          " --op-reps " + std::to_string(reps) + (ops ? " --ops" : "");
  FILE* pipe = popen(cmd.c_str(), "r");
  HSGD_CHECK(pipe != nullptr, "could not run '", cmd, "'");
  TorchResult r;
  char line[512];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    std::istringstream in(line);
    std::string key;
    in >> key;
    if (key == "images_per_s") {
      in >> r.images_per_s;
    } else if (key == "op") {
      std::string name;
      OpTime t;
      in >> name >> t.fwd_ms >> t.bwd_ms >> t.count;
      r.ops[name] = t;
    }
  }
  const int status = pclose(pipe);
  HSGD_CHECK(status == 0 && r.images_per_s > 0, "'", cmd, "' failed (status ", status, ")");
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "resnet20";
  int64_t batch = 128;
  int steps = 10, warmup = 2, reps = 5;
  bool no_torch = false, no_ops = false;
  std::string script =
      (std::filesystem::path(__FILE__).parent_path() / "resnet_step_bench_torch.py").string();
  CLI::App app{"ResNet training-step throughput: hsgd vs PyTorch."};
  app.add_option("--model", model, "Model name (models::make_model)")->capture_default_str();
  app.add_option("--batch-size", batch, "Images per step")->capture_default_str();
  app.add_option("--steps", steps, "Timed steps (fastest reported)")->capture_default_str();
  app.add_option("--warmup", warmup, "Untimed steps first")->capture_default_str();
  app.add_option("--op-reps", reps, "Repetitions per op in the op table")->capture_default_str();
  app.add_flag("--no-torch", no_torch, "Skip PyTorch");
  app.add_flag("--no-ops", no_ops, "Skip the per-op table");
  app.add_option("--torch-script", script, "Path of resnet_step_bench_torch.py");
  CLI11_PARSE(app, argc, argv);

  try {
    std::printf("resnet_step_bench: %s, batch %lld, best of %d steps; OpenBLAS core %s\n",
                model.c_str(), static_cast<long long>(batch), steps, openblas_get_corename());
    std::printf("\n%-8s %7s %10s %10s %9s %9s %9s %13s\n", "impl", "threads", "step_ms", "images/s",
                "fwd_ms", "bwd_ms", "sgd_ms", "hsgd/torch");
    std::map<int, double> hsgd_ips;
    std::map<int, TorchResult> torch;
    for (int threads : {1, 2}) {
      openblas_set_num_threads(threads);
      const StepResult r = hsgd_step_time(model, batch, warmup, steps);
      hsgd_ips[threads] = static_cast<double>(batch) / r.step_s;
      std::printf("%-8s %7d %10.1f %10.1f %9.1f %9.1f %9.1f %13s\n", "hsgd", threads,
                  1e3 * r.step_s, hsgd_ips[threads], 1e3 * r.forward_s, 1e3 * r.backward_s,
                  1e3 * r.optimizer_s, "");
      std::fflush(stdout);
      if (no_torch) continue;
      torch[threads] =
          run_torch(script, model, threads, batch, steps, !no_ops && threads == 1, reps);
      std::printf("%-8s %7d %10.1f %10.1f %9s %9s %9s %13.2f\n", "torch", threads,
                  1e3 * batch / torch[threads].images_per_s, torch[threads].images_per_s, "-", "-",
                  "-", hsgd_ips[threads] / torch[threads].images_per_s);
      std::fflush(stdout);
    }
    if (no_ops) return 0;

    openblas_set_num_threads(1);
    const std::map<std::string, OpTime> ours = hsgd_op_times(batch, reps);
    std::printf("\nper op at %s shapes, 1 thread, ms per call (x count = per step):\n",
                "ResNet-20");
    std::printf("%-24s %5s %9s %9s %9s %9s %10s %10s %7s\n", "op", "count", "hsgd_fwd", "hsgd_bwd",
                "torch_fwd", "torch_bwd", "hsgd_step", "torch_step", "time_x");
    double total_ours = 0, total_torch = 0;
    const std::map<std::string, OpTime> empty;
    const auto& theirs = torch.count(1) ? torch[1].ops : empty;
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
    return 0;
  } catch (const hsgd::Error& e) {
    std::fprintf(stderr, "resnet_step_bench: error: %s\n", e.what());
    return 1;
  }
}
