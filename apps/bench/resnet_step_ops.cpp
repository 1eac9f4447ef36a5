#include "apps/bench/resnet_step_ops.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "apps/bench/bench_util.h"
#include "comm/error.h"
#include "framework/parallel/parallel.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"

namespace resnet_bench {
namespace {

using namespace hsgd;
using Clock = std::chrono::steady_clock;

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

// The fastest of `reps` calls of fn, after one warm-up call, in seconds.
double best_time(const std::function<void()>& fn, int reps) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return *std::min_element(t.begin(), t.end());
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

// ---- the PyTorch op table ----

// resnet_step_bench_torch.py --ops-only prints "RESULT NAME FWD_MS BWD_MS COUNT" per op.
std::map<std::string, OpTime> torch_op_times(const std::string& script, int64_t batch, int reps,
                                             int threads) {
  const auto results =
      run_python_results(script,
                         {"--threads", std::to_string(threads), "--ops-only", "--batch-size",
                          std::to_string(batch), "--op-reps", std::to_string(reps)},
                         900);
  std::map<std::string, OpTime> ops;
  for (const auto& fields : results) {
    HSGD_CHECK_AS(Error, fields.size() == 4, script,
                  ": expected 'RESULT NAME FWD_MS BWD_MS COUNT', got ", fields.size(), " fields");
    ops[fields[0]] = {std::stod(fields[1]), std::stod(fields[2]), std::stoll(fields[3])};
  }
  return ops;
}

}  // namespace

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

void print_op_table(const std::string& script, int64_t batch, int reps, bool no_torch,
                    int threads) {
  set_num_threads(threads);
  const std::map<std::string, OpTime> ours = hsgd_op_times(batch, reps);
  const std::map<std::string, OpTime> theirs =
      no_torch ? std::map<std::string, OpTime>{} : torch_op_times(script, batch, reps, threads);
  std::printf(
      "\nper op at ResNet-20 shapes, batch %lld, %d thread%s, best of %d calls, ms per call (x "
      "count = per step; hsgd's backward includes accumulating the leaves' .grad, torch's "
      "autograd.grad does not):\n",
      static_cast<long long>(batch), threads, threads == 1 ? "" : "s", reps);
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

}  // namespace resnet_bench
