// ddp_bench: DistributedDataParallel training-step time (zero_grad, forward, cross-entropy,
// backward with bucketed allreduce, SGD step) at --world ranks, one process and one BLAS thread
// each, for the MLP 784-512-256-10 (batch 64 per rank) and ResNet-20 (batch 32 of 3x32x32 per
// rank), side by side with PyTorch DDP on gloo (apps/bench/ddp_bench_torch.py, /usr/bin/python3).
// Reports the max over ranks of each rank's median step time.
//
//   ddp_bench [--world 4] [--iters-mlp 30] [--iters-resnet 10] [--quick] [--no-torch]

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "apps/bench/bench_util.h"
#include "comm/process_group/process_group.h"
#include "comm/store/file_store.h"
#include "framework/distributed/ddp.h"
#include "framework/tensor/ops.h"
#include "models/mlp.h"
#include "models/resnet.h"
#include "optim/sgd.h"

extern "C" char* openblas_get_corename();

namespace {

namespace fs = std::filesystem;
using hsgd::Tensor;

struct Case {
  std::string name;  // as the torch script calls it
  int iters = 0;
};

// One rank; returns the max over ranks of each rank's median step in ms.
std::string run_rank(int rank, int world, const fs::path& dir, const Case& c, int warmup,
                     bool shared_memory) {
  hsgd::comm::InitOptions init;
  init.rank = rank;
  init.world_size = world;
  init.store = std::make_shared<hsgd::comm::FileStore>(dir / "store");
  init.token = "ddp-bench-token";  // one host, one run: a fixed token keys the TLS data plane
  init.timeout = std::chrono::seconds(120);
  init.shared_memory = shared_memory;
  auto pg = hsgd::comm::init_process_group(init);

  std::shared_ptr<hsgd::nn::Module> model;
  hsgd::Shape shape;
  if (c.name == "mlp") {
    model = std::make_shared<hsgd::models::MLP>(hsgd::models::MLPOptions{
        .sizes = {784, 512, 256, 10}, .seed = static_cast<uint64_t>(rank)});
    shape = {64, 1, 28, 28};
  } else {
    model = std::make_shared<hsgd::models::ResNet>(
        hsgd::models::resnet_cifar_options(20, 10, static_cast<uint64_t>(rank)));
    shape = {32, 3, 32, 32};
  }
  hsgd::distributed::DistributedDataParallel ddp(model, pg);
  hsgd::optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  hsgd::Generator gen(static_cast<uint64_t>(rank));
  const Tensor x = hsgd::randn(shape, gen);
  std::vector<int64_t> y;
  for (int64_t i = 0; i < shape[0]; ++i) y.push_back(static_cast<int64_t>(gen.next_below(10)));

  std::vector<double> times;
  for (int i = 0; i < warmup + c.iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    opt.zero_grad();
    hsgd::cross_entropy(ddp.forward(x), y).backward();
    opt.step();
    const std::chrono::duration<double, std::milli> ms = std::chrono::steady_clock::now() - start;
    if (i >= warmup) times.push_back(ms.count());
  }
  std::vector<double> mine = {median(times)};
  pg->allreduce(std::span<double>(mine), hsgd::comm::ReduceOp::kMax)->wait();
  pg->barrier()->wait();
  return std::to_string(mine[0]);
}

// Forks the ranks, waits (killing them by pid after the deadline), reads rank 0's result.
bool run_hsgd(int world, const Case& c, int warmup, bool shared_memory, double& ms) {
  const fs::path dir =
      fs::temp_directory_path() / ("hsgd_ddp_bench_" + std::to_string(getpid()) + "_" + c.name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  bool ok = false;
  try {
    const auto results = run_forked_ranks(world, std::chrono::minutes(20), c.name, [&](int rank) {
      return run_rank(rank, world, dir, c, warmup, shared_memory);
    });
    ms = std::stod(results[0]);
    ok = true;
  } catch (const hsgd::Error& e) {
    std::cerr << e.what() << "\n";
  }
  fs::remove_all(dir);
  return ok;
}

bool run_torch(int world, const Case& c, int warmup, const std::string& script, double& ms) {
  const fs::path store =
      fs::temp_directory_path() / ("hsgd_ddp_torch_" + std::to_string(getpid()) + "_store");
  bool ok = false;
  try {
    const auto results = run_python_results(
        script,
        {"--model", c.name, "--world", std::to_string(world), "--iters", std::to_string(c.iters),
         "--warmup", std::to_string(warmup), "--store", store.string()},
        1200);
    ms = std::stod(results.back().at(0));
    ok = true;
  } catch (const std::exception& e) {
    std::cerr << "ddp_bench: PyTorch column skipped: " << e.what() << "\n";
  }
  fs::remove(store);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  // One BLAS thread per rank, as the PyTorch side uses torch.set_num_threads(1). OpenBLAS reads
  // the variable when it loads, so set it and start again.
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) {
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    execv("/proc/self/exe", argv);
  }
  CLI::App app{"DDP training step: hsgd vs PyTorch"};
  int world = 4, iters_mlp = 30, iters_resnet = 10, warmup = 3;
  bool quick = false, no_torch = false;
  std::string script = HSGD_BENCH_DIR "/ddp_bench_torch.py";
  app.add_option("--world", world, "ranks")->check(CLI::Range(1, 64));
  app.add_option("--iters-mlp", iters_mlp, "timed steps, MLP");
  app.add_option("--iters-resnet", iters_resnet, "timed steps, ResNet-20");
  app.add_option("--torch-script", script, "the PyTorch side");
  app.add_flag("--quick", quick, "few steps");
  app.add_flag("--no-torch", no_torch, "skip PyTorch");
  bool no_tcp = false;
  app.add_flag("--no-tcp", no_tcp,
               "skip the second hsgd run with shared memory off (HSGD_SHM=0: Gloo's TCP only)");
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    iters_mlp = 5;
    iters_resnet = 2;
    warmup = 1;
  }
  std::printf(
      "DDP step at %d ranks, median ms per step (max over ranks); OpenBLAS core %s, "
      "OPENBLAS_NUM_THREADS=%s\n",
      world, openblas_get_corename(), std::getenv("OPENBLAS_NUM_THREADS"));
  std::printf("%-10s %10s %10s %10s %7s %9s\n", "model", "hsgd ms", "tcp ms", "torch ms", "ratio",
              "tcp ratio");
  int failures = 0;
  for (const Case& c : {Case{"mlp", iters_mlp}, Case{"resnet20", iters_resnet}}) {
    double h = -1, tcp = -1, t = -1;
    const bool hok = run_hsgd(world, c, warmup, true, h);
    const bool cok = world > 1 && !no_tcp && run_hsgd(world, c, warmup, false, tcp);
    const bool tok = !no_torch && run_torch(world, c, warmup, script, t);
    failures += hok ? 0 : 1;
    char torch_ms[32] = "n/a", ratio[32] = "n/a", tcp_ms[32] = "n/a", tcp_ratio[32] = "n/a";
    if (cok) std::snprintf(tcp_ms, sizeof tcp_ms, "%.2f", tcp);
    if (tok) {
      std::snprintf(torch_ms, sizeof torch_ms, "%.2f", t);
      if (hok) std::snprintf(ratio, sizeof ratio, "%.2f", h / t);
      if (cok) std::snprintf(tcp_ratio, sizeof tcp_ratio, "%.2f", tcp / t);
    }
    std::printf("%-10s %10.2f %10s %10s %7s %9s\n", c.name.c_str(), h, tcp_ms, torch_ms, ratio,
                tcp_ratio);
    std::fflush(stdout);
  }
  std::printf(
      "hsgd: allreduce over shared memory within the node (the default); tcp: the same with "
      "HSGD_SHM=0 (Gloo's TCP transport, like torch)\nratio = hsgd / torch, tcp ratio = tcp / "
      "torch (lower is better)\n");
  return failures == 0 ? 0 : 1;
}
