#pragma once
// resnet_step_bench's measurement of one configuration (model, batch, threads): the training step
// in hsgd (a forked child) and in PyTorch (resnet_step_bench_torch.py), each in a fresh process,
// plus OpenBLAS sgemm's rate that the table's "peak %" relates to.

#include <cstdint>
#include <string>

#include "apps/bench/bench_util.h"

namespace resnet_bench {

struct Config {
  std::string model;  // resnet20 or mlp
  int64_t batch = 0;
  int threads = 1;
};

// "MODEL batch B threads T": a configuration's key and its name in error messages.
std::string describe(const Config& c);

using Measurement = StepMeasurement;  // bench_util.h

// hsgd's step in a forked child: builds the model, takes `warmup` untimed and `steps` timed
// steps. Throws hsgd::Error when the child fails or takes longer than 900 s (it is killed).
Measurement hsgd_run(const Config& c, int warmup, int steps);

// The same step in PyTorch: `script` is resnet_step_bench_torch.py, run with /usr/bin/python3
// under a 900 s timeout. Throws hsgd::Error naming the command when it fails.
Measurement torch_run(const std::string& script, const Config& c, int warmup, int steps);

// OpenBLAS sgemm on a 1536 x 1536 product at `threads` threads, best of 3 runs, in GFLOP/s.
double sgemm_gflops(int threads);

}  // namespace resnet_bench
