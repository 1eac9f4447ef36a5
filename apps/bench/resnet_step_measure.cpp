#include "apps/bench/resnet_step_measure.h"

#include <cblas.h>
#include <unistd.h>

#include <chrono>
#include <sstream>
#include <vector>

#include "apps/bench/bench_util.h"
#include "comm/error.h"
#include "framework/nn/functional.h"
#include "framework/parallel/parallel.h"
#include "framework/tensor/ops.h"
#include "models/registry.h"
#include "optim/sgd.h"

namespace resnet_bench {
namespace {

using namespace hsgd;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Shape input_shape(const std::string& model) {
  return model == "mlp" ? Shape{1, 28, 28} : Shape{3, 32, 32};
}

// Runs in a forked child: build, warm up, time `steps` steps.
Measurement hsgd_measure(const Config& c, int warmup, int steps) {
  set_num_threads(c.threads);
  const double before = reset_peak_rss_mb();
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
  return {median(times), process_status_kb(::getpid(), "VmHWM") / 1024.0 - before};
}

}  // namespace

std::string describe(const Config& c) {
  return c.model + " batch " + std::to_string(c.batch) + " threads " + std::to_string(c.threads);
}

Measurement hsgd_run(const Config& c, int warmup, int steps) {
  return measure_in_child("hsgd " + describe(c), [&] { return hsgd_measure(c, warmup, steps); });
}

Measurement torch_run(const std::string& script, const Config& c, int warmup, int steps) {
  const auto results =
      run_python_results(script,
                         {"--model", c.model, "--threads", std::to_string(c.threads),
                          "--batch-size", std::to_string(c.batch), "--warmup",
                          std::to_string(warmup), "--steps", std::to_string(steps)},
                         900);
  return parse_step_measurement(results.back(), "torch " + describe(c));
}

double sgemm_gflops(int threads) {
  set_num_threads(threads);
  constexpr int n = 1536;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  double best = 0;
  for (int r = 0; r < 4; ++r) {
    const auto start = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    const double s = seconds_since(start);
    if (r > 0 && (best == 0 || s < best)) best = s;  // the first run warms up
  }
  return 2.0 * n * n * n / best / 1e9;
}

}  // namespace resnet_bench
