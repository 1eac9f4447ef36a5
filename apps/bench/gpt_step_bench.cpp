// gpt_step_bench: the training step of a GPT (models::GPT; PyTorch: models/gpt_torch.py) in hsgd
// and in PyTorch on this machine, at each --threads count, side by side.
//
//   gpt_step_bench                                    # d_model 128, 4 layers, 4 heads, context
//                                                     # 128, batch 32, dropout 0.1; 1 and 2 threads
//   gpt_step_bench --threads 1 --rounds 1 --steps 3 --no-torch
//
// A training step is zero_grad, forward, next-token cross_entropy, backward and AdamW (lr 1e-3,
// weight decay 0.1) on a fixed random batch of byte ids. Every measurement runs in a fresh
// process (hsgd: a forked child; PyTorch: gpt_step_bench_torch.py under /usr/bin/python3) that
// builds the model, takes --warmup untimed steps and --steps timed ones, and reports the median
// step and its peak resident memory above what the process held before it built the model. The
// two alternate, one thread count at a time, for --rounds rounds; the table shows the median
// over the rounds (the machine is shared and noisy). "best" compares each at its fastest thread
// count. GFLOP/s counts the step's matrix products: 3x the forward's (the backward does twice its
// work): per token and layer 2 * 12 d^2 (the four linear layers) + 2 * T d (causal attention:
// half of the T x T scores and of their product with the values), plus 2 * d * vocab for the
// head. "peak %" relates it to sgemm (kernels::sgemm, as the layers call it) on a 1536^3 product
// measured here at the same thread count.
//
// --cpu-time times everything (the steps on both sides and the sgemm peak) in the CPU time of the
// measuring process instead of wall time: on a machine shared with other work it leaves out the
// time the others hold the cores, but at more than one thread it adds up every thread's time, so
// it then measures work, not speed. Its 1-thread rows are the ones to compare under load.

#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "apps/bench/bench_util.h"
#include "comm/error.h"
#include "framework/kernels/sgemm.h"
#include "framework/parallel/parallel.h"
#include "framework/tensor/ops.h"
#include "models/gpt.h"
#include "optim/adam.h"

extern "C" char* openblas_get_corename(void);

namespace {

using namespace hsgd;
using Clock = std::chrono::steady_clock;

struct Config {
  models::GPTOptions gpt;
  int64_t batch = 32;
  int warmup = 2, steps = 5;
  bool cpu_time = false;  // time in process CPU seconds instead of wall seconds
};

using Measurement = StepMeasurement;

// Seconds on the clock that --cpu-time chooses: the process's CPU time or the wall clock.
double now_seconds(bool cpu_time) {
  if (!cpu_time) return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Runs in a forked child.
Measurement hsgd_measure(const Config& c, int threads) {
  set_num_threads(threads);
  const double before = reset_peak_rss_mb();
  models::GPT model(c.gpt);
  optim::AdamW opt(model.parameters(), {.lr = 1e-3, .weight_decay = 0.1});
  Generator gen(1);
  const int64_t t = c.gpt.context, v = c.gpt.vocab_size;
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < c.batch * (t + 1); ++i) {
    ids.push_back(static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(v))));
  }
  const IndexTensor all(ids, {c.batch, t + 1});
  const IndexTensor x = all.narrow(1, 0, t), y = all.narrow(1, 1, t).reshape({-1});
  std::vector<double> times;
  for (int i = 0; i < c.warmup + c.steps; ++i) {
    const double t0 = now_seconds(c.cpu_time);
    opt.zero_grad();
    cross_entropy(model.forward(x).reshape({-1, v}), y).backward();
    opt.step();
    if (i >= c.warmup) times.push_back(1e3 * (now_seconds(c.cpu_time) - t0));
  }
  return {median(times), process_status_kb(::getpid(), "VmHWM") / 1024.0 - before};
}

Measurement hsgd_run(const Config& c, int threads) {
  return measure_in_child("hsgd gpt threads " + std::to_string(threads),
                          [&] { return hsgd_measure(c, threads); });
}

Measurement torch_run(const std::string& script, const Config& c, int threads) {
  const models::GPTOptions& g = c.gpt;
  const auto results = run_python_results(
      script,
      {"--threads", std::to_string(threads), "--batch-size", std::to_string(c.batch), "--context",
       std::to_string(g.context), "--d-model", std::to_string(g.d_model), "--layers",
       std::to_string(g.n_layers), "--heads", std::to_string(g.n_heads), "--dropout",
       std::to_string(g.dropout), "--warmup", std::to_string(c.warmup), "--steps",
       std::to_string(c.steps), c.cpu_time ? "--cpu-time" : "--wall-time"},
      900);
  return parse_step_measurement(results.back(), "torch gpt threads " + std::to_string(threads));
}

// Matrix-product FLOPs of one training step (see the file comment).
double step_flops(const Config& c) {
  const auto d = static_cast<double>(c.gpt.d_model), t = static_cast<double>(c.gpt.context);
  const double per_token = static_cast<double>(c.gpt.n_layers) * (24 * d * d + 2 * t * d) +
                           2 * d * static_cast<double>(c.gpt.vocab_size);
  return 3 * per_token * t * static_cast<double>(c.batch);
}

// kernels::sgemm on a 1536^3 product at `threads` threads: the best of 3 runs after a warm-up,
// in GFLOP/s, timed on --cpu-time's clock.
double sgemm_gflops(int threads, bool cpu_time) {
  set_num_threads(threads);
  constexpr int64_t n = 1536;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), out(n * n);
  double best = 0;
  for (int r = 0; r < 4; ++r) {
    const double start = now_seconds(cpu_time);
    kernels::sgemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, out.data(), n);
    const double s = now_seconds(cpu_time) - start;
    if (r > 0 && (best == 0 || s < best)) best = s;
  }
  return 2.0 * n * n * n / best / 1e9;
}

std::vector<int> parse_threads(const std::string& text) {
  std::vector<int> out;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    std::istringstream one(item);
    int v = 0;
    HSGD_CHECK(static_cast<bool>(one >> v) && one.eof() && v >= 1, "--threads: '", item, "' in '",
               text, "' is not a thread count >= 1");
    out.push_back(v);
  }
  HSGD_CHECK(!out.empty(), "--threads: empty list");
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  c.gpt = {.vocab_size = 256,
           .context = 128,
           .d_model = 128,
           .n_layers = 4,
           .n_heads = 4,
           .dropout = 0.1};
  std::string threads_text = "1,2";
  int rounds = 3;
  bool no_torch = false;
  std::string script = HSGD_BENCH_DIR "/gpt_step_bench_torch.py";
  CLI::App app{"Training-step time of a GPT: hsgd vs PyTorch."};
  app.add_option("--threads", threads_text, "Comma-separated thread counts")->capture_default_str();
  app.add_option("--batch-size", c.batch, "Sequences per step")->capture_default_str();
  app.add_option("--context", c.gpt.context, "Tokens per sequence")->capture_default_str();
  app.add_option("--d-model", c.gpt.d_model, "Model width")->capture_default_str();
  app.add_option("--layers", c.gpt.n_layers, "Transformer blocks")->capture_default_str();
  app.add_option("--heads", c.gpt.n_heads, "Attention heads")->capture_default_str();
  app.add_option("--dropout", c.gpt.dropout, "Dropout")->capture_default_str();
  app.add_option("--rounds", rounds, "Rounds alternating hsgd and PyTorch (median reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_option("--steps", c.steps, "Timed steps per measurement (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--warmup", c.warmup, "Untimed steps first")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  app.add_flag("--no-torch", no_torch, "Skip PyTorch");
  app.add_flag("--cpu-time", c.cpu_time,
               "Time steps and the sgemm peak in process CPU time (see the file comment)");
  app.add_option("--torch-script", script, "Path of gpt_step_bench_torch.py")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    const std::vector<int> threads = parse_threads(threads_text);
    models::GPT check(c.gpt);  // refuses bad sizes before anything is measured
    std::map<int, double> peak;
    for (int t : threads) peak[t] = sgemm_gflops(t, c.cpu_time);
    std::printf(
        "gpt_step_bench: GPT d_model %lld, %lld layers, %lld heads, context %lld, batch %lld, "
        "dropout %g, AdamW; %.2f GFLOP per step; kernels: sgemm %s, elementwise %s (this CPU: "
        "%s); OpenBLAS core %s (for shapes hsgd's sgemm hands it); median of %d rounds x %d "
        "steps (after %d warm-up), %s\n",
        static_cast<long long>(c.gpt.d_model), static_cast<long long>(c.gpt.n_layers),
        static_cast<long long>(c.gpt.n_heads), static_cast<long long>(c.gpt.context),
        static_cast<long long>(c.batch), c.gpt.dropout, step_flops(c) / 1e9,
        kernels::simd::isa_name(kernels::sgemm_isa()),
        kernels::simd::isa_name(kernels::simd::conv_isa()), cpu_model().c_str(),
        openblas_get_corename(), rounds, c.steps, c.warmup,
        c.cpu_time ? "timed in process CPU time" : "timed on the wall clock");
    for (int t : threads) {
      std::printf("sgemm 1536^3 at %d thread%s: %.1f GFLOP/s (best of 3)\n", t, t == 1 ? "" : "s",
                  peak[t]);
    }
    std::map<int, std::vector<Measurement>> ours, theirs;
    for (int r = 0; r < rounds; ++r) {
      for (int t : threads) {
        ours[t].push_back(hsgd_run(c, t));
        if (!no_torch) theirs[t].push_back(torch_run(script, c, t));
      }
      std::fprintf(stderr, "round %d of %d done\n", r + 1, rounds);
    }
    auto med = [](const std::vector<Measurement>& v, double Measurement::*field) {
      std::vector<double> x;
      for (const auto& m : v) x.push_back(m.*field);
      return median(x);
    };
    std::printf("\nmedian over %d rounds of each round's median step:\n", rounds);
    std::printf("%7s %9s %9s %8s %8s %7s %9s %9s\n", "threads", "hsgd_ms", "torch_ms", "time_x",
                "GFLOP/s", "peak%", "hsgd_MB", "torch_MB");
    double best_ours = 0, best_theirs = 0;
    for (int t : threads) {
      const double h_ms = med(ours[t], &Measurement::step_ms);
      const double h_mb = med(ours[t], &Measurement::peak_mb);
      const double gflops = step_flops(c) / h_ms / 1e6;
      if (best_ours == 0 || h_ms < best_ours) best_ours = h_ms;
      if (no_torch) {
        std::printf("%7d %9.1f %9s %8s %8.1f %6.0f%% %9.1f %9s\n", t, h_ms, "-", "-", gflops,
                    100 * gflops / peak[t], h_mb, "-");
        continue;
      }
      const double t_ms = med(theirs[t], &Measurement::step_ms);
      const double t_mb = med(theirs[t], &Measurement::peak_mb);
      if (best_theirs == 0 || t_ms < best_theirs) best_theirs = t_ms;
      std::printf("%7d %9.1f %9.1f %8.2f %8.1f %6.0f%% %9.1f %9.1f\n", t, h_ms, t_ms, h_ms / t_ms,
                  gflops, 100 * gflops / peak[t], h_mb, t_mb);
    }
    if (!no_torch) {
      std::printf("%7s %9.1f %9.1f %8.2f\n", "best", best_ours, best_theirs,
                  best_ours / best_theirs);
    }
    std::printf(
        "time_x = hsgd time / PyTorch time (< 1: hsgd faster); MB = peak RSS of a step above the "
        "process's before the model\n");
    return 0;
  } catch (const hsgd::Error& e) {
    std::fprintf(stderr, "gpt_step_bench: error: %s\n", e.what());
    return 1;
  }
}
