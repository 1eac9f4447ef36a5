// resnet_step_bench: the training step of ResNet-20 and of the MLP in hsgd and in PyTorch on this
// machine, at 1 and 2 threads and batch 32 and 128, and (--ops) the time of each op kind at
// ResNet-20's shapes in both, to show which op dominates.
//
//   resnet_step_bench                                 # the full table: about 10 minutes
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

#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "apps/bench/bench_util.h"
#include "apps/bench/resnet_step_measure.h"
#include "apps/bench/resnet_step_ops.h"
#include "comm/error.h"
#include "framework/kernels/conv_simd.h"

extern "C" char* openblas_get_corename(void);

namespace {

using namespace resnet_bench;

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
        "resnet_step_bench: conv kernels %s (HSGD_CONV_ISA=avx2 forces AVX2), OpenBLAS core %s; "
        "median of %d rounds x %d steps (after %d warm-up)\n",
        hsgd::kernels::simd::isa_name(hsgd::kernels::simd::conv_isa()), openblas_get_corename(),
        rounds, steps, warmup);
    for (int t : thread_list) {
      std::printf("sgemm 1536^3 at %d thread%s: %.1f GFLOP/s (best of 3)\n", t, t == 1 ? "" : "s",
                  peak[t]);
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
    std::printf("\nmedian over %d rounds of each round's median step:\n", rounds);
    std::printf("%-9s %5s %7s %9s %9s %8s %8s %7s %9s %9s\n", "model", "batch", "threads",
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
