// averaging_bench: time of HierarchicalModelAverager::average_parameters at --world ranks (one
// process each, Gloo over loopback) for the parameter shapes of ResNet-20 (272K parameters) and
// ResNet-18 (11.2M), per level of a {1: world/2, 2: world} hierarchy, side by side with
// PyTorch's HierarchicalModelAverager on the same shapes (apps/bench/averaging_bench_torch.py,
// run with /usr/bin/python3). Reports medians (the max over ranks of each rank's median) and
// the resident-memory growth of a rank over the timed calls.
//
//   averaging_bench [--world 4] [--iters-small 100] [--iters-large 10] [--quick] [--no-torch]
//                   [--algorithm
//                   auto|halving-doubling|ring-chunked|ring|pinned-ring|direct|direct-scatter]

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
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
#include "framework/distributed/model_averaging/hierarchical_model_averager.h"
#include "models/resnet.h"

namespace {

namespace fs = std::filesystem;
using hsgd::Shape;
using hsgd::Tensor;

struct Workload {
  std::string name;
  std::vector<Shape> shapes;
  int64_t numel = 0;
  int iters = 0;  // timed calls per level
};

struct Timing {
  double level_ms[2] = {0, 0};  // median per level, max over ranks
  double rss_growth_kb = 0;     // max over ranks
};

double rss_kb() {
  std::ifstream statm("/proc/self/statm");
  long size = 0, resident = 0;
  statm >> size >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / 1024.0;
}

// One rank: builds the tensors, times the calls; returns "level0_ms level1_ms rss_growth_kb",
// each the max over ranks.
std::string run_rank(int rank, int world, const fs::path& dir, const Workload& w, int warmup,
                     hsgd::comm::AllreduceAlgorithm algorithm, bool shared_memory) {
  hsgd::comm::InitOptions init;
  init.rank = rank;
  init.world_size = world;
  init.store = std::make_shared<hsgd::comm::FileStore>(dir / "store");
  init.token = "averaging-bench-token";  // one host, one run: a fixed token keys the TLS data plane
  init.timeout = std::chrono::seconds(120);
  init.allreduce_algorithm = algorithm;
  init.shared_memory = shared_memory;
  auto pg = hsgd::comm::init_process_group(init);

  std::vector<Tensor> params;
  for (const Shape& s : w.shapes) {
    Tensor p = hsgd::full(s, static_cast<float>(rank)).set_requires_grad(true);
    p.set_grad(hsgd::ones(s));
    params.push_back(p);
  }
  hsgd::distributed::HierarchicalModelAverager averager({{1, world / 2}, {2, world}}, 0, pg);
  for (int i = 0; i < 2 * warmup; ++i) averager.average_parameters(params);

  std::vector<double> times[2];
  const double rss_before = rss_kb();
  for (int i = 0; i < 2 * w.iters; ++i) {
    const int level = averager.level_at(averager.step());
    const auto start = std::chrono::steady_clock::now();
    averager.average_parameters(params);
    const std::chrono::duration<double, std::milli> ms = std::chrono::steady_clock::now() - start;
    times[level].push_back(ms.count());
  }
  std::vector<double> mine = {median(times[0]), median(times[1]), rss_kb() - rss_before};
  pg->allreduce(std::span<double>(mine), hsgd::comm::ReduceOp::kMax)->wait();
  pg->barrier()->wait();
  std::ostringstream out;
  out << mine[0] << " " << mine[1] << " " << mine[2];
  return out.str();
}

// Forks `world` ranks and waits for them (killing them by pid after the deadline).
bool run_hsgd(int world, const Workload& w, int warmup, hsgd::comm::AllreduceAlgorithm algorithm,
              bool shared_memory, Timing& out) {
  const fs::path dir = fs::temp_directory_path() /
                       ("hsgd_averaging_bench_" + std::to_string(getpid()) + "_" + w.name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  bool ok = false;
  try {
    const auto results = run_forked_ranks(world, std::chrono::minutes(20), w.name, [&](int rank) {
      return run_rank(rank, world, dir, w, warmup, algorithm, shared_memory);
    });
    std::istringstream in(results[0]);
    ok = static_cast<bool>(in >> out.level_ms[0] >> out.level_ms[1] >> out.rss_growth_kb);
  } catch (const hsgd::Error& e) {
    std::cerr << e.what() << "\n";
  }
  fs::remove_all(dir);
  return ok;
}

// Runs the PyTorch script on the same shapes; false when it fails (the table then says so).
bool run_torch(int world, const Workload& w, int warmup, const std::string& script, Timing& out) {
  const fs::path dir =
      fs::temp_directory_path() / ("hsgd_averaging_torch_" + std::to_string(getpid()));
  fs::create_directories(dir);
  {
    std::ofstream shapes(dir / "shapes.txt");
    for (const Shape& s : w.shapes) {
      for (int64_t d : s) shapes << d << " ";
      shapes << "\n";
    }
  }
  bool ok = false;
  try {
    const auto results =
        run_python_results(script,
                           {"--shapes", (dir / "shapes.txt").string(), "--world",
                            std::to_string(world), "--iters", std::to_string(w.iters), "--warmup",
                            std::to_string(warmup), "--store", (dir / "store").string()},
                           1200);
    out.level_ms[0] = std::stod(results.back().at(0));
    out.level_ms[1] = std::stod(results.back().at(1));
    ok = true;
  } catch (const std::exception& e) {
    std::cerr << "averaging_bench: PyTorch column skipped: " << e.what() << "\n";
  }
  fs::remove_all(dir);
  return ok;
}

Workload workload_of(const std::string& name, const hsgd::models::ResNetOptions& options,
                     int iters) {
  hsgd::models::ResNet model(options);
  Workload w{name, {}, 0, iters};
  for (const Tensor& p : model.parameters()) {
    w.shapes.push_back(p.shape());
    w.numel += p.numel();
  }
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Hierarchical model averaging: hsgd vs PyTorch"};
  int world = 4, iters_small = 100, iters_large = 10, warmup = 2;
  bool quick = false, no_torch = false;
  std::string script = HSGD_BENCH_DIR "/averaging_bench_torch.py";
  app.add_option("--world", world, "ranks (even)")->check(CLI::Range(2, 64));
  app.add_option("--iters-small", iters_small, "timed calls per level, ResNet-20 sizes");
  app.add_option("--iters-large", iters_large, "timed calls per level, ResNet-18 sizes");
  app.add_option("--torch-script", script, "the PyTorch side");
  std::string algorithm_name = "auto";
  app.add_option("--algorithm", algorithm_name,
                 "hsgd allreduce: auto, halving-doubling, ring-chunked, ring, pinned-ring, direct, "
                 "direct-scatter")
      ->check(CLI::IsMember(hsgd::comm::allreduce_algorithm_names()));
  app.add_flag("--quick", quick, "few iterations");
  app.add_flag("--no-torch", no_torch, "skip PyTorch");
  bool no_tcp = false;
  app.add_flag("--no-tcp", no_tcp,
               "skip the second hsgd run with shared memory off (HSGD_SHM=0: Gloo's TCP only)");
  CLI11_PARSE(app, argc, argv);
  if (world % 2 != 0) {
    std::cerr << "--world must be even (the hierarchy is {1: world/2, 2: world}), got " << world
              << "\n";
    return 2;
  }
  const hsgd::comm::AllreduceAlgorithm algorithm =
      hsgd::comm::allreduce_algorithm_named(algorithm_name, "--algorithm");
  if (quick) {
    iters_small = 10;
    iters_large = 3;
    warmup = 1;
  }

  const std::vector<Workload> workloads = {
      workload_of("ResNet-20", hsgd::models::resnet_cifar_options(20), iters_small),
      workload_of("ResNet-18", hsgd::models::resnet18_options(), iters_large)};

  std::printf(
      "average_parameters at %d ranks, hierarchy {1:%d, 2:%d}, median ms per call, "
      "hsgd allreduce algorithm %s\n",
      world, world / 2, world, algorithm_name.c_str());
  std::printf("%-10s %9s %8s %-14s %9s %9s %9s %7s %9s %12s\n", "model", "params", "tensors",
              "level", "hsgd ms", "tcp ms", "torch ms", "ratio", "tcp ratio", "hsgd RSS +KB");
  int failures = 0;
  for (const Workload& w : workloads) {
    Timing h, tcp, t;
    const bool hok = run_hsgd(world, w, warmup, algorithm, true, h);
    const bool cok = !no_tcp && run_hsgd(world, w, warmup, algorithm, false, tcp);
    const bool tok = !no_torch && run_torch(world, w, warmup, script, t);
    failures += hok ? 0 : 1;
    for (int level = 0; level < 2; ++level) {
      const int size = level == 0 ? world / 2 : world;
      const std::string name =
          "every " + std::to_string(level + 1) + ", " + std::to_string(size) + " rk";
      char torch_ms[32] = "n/a", ratio[32] = "n/a", tcp_ms[32] = "n/a", tcp_ratio[32] = "n/a";
      if (cok) std::snprintf(tcp_ms, sizeof tcp_ms, "%.3f", tcp.level_ms[level]);
      if (tok) {
        std::snprintf(torch_ms, sizeof torch_ms, "%.3f", t.level_ms[level]);
        if (hok) std::snprintf(ratio, sizeof ratio, "%.2f", h.level_ms[level] / t.level_ms[level]);
        if (cok) {
          std::snprintf(tcp_ratio, sizeof tcp_ratio, "%.2f",
                        tcp.level_ms[level] / t.level_ms[level]);
        }
      }
      std::printf("%-10s %9lld %8zu %-14s %9.3f %9s %9s %7s %9s %12.0f\n", w.name.c_str(),
                  static_cast<long long>(w.numel), w.shapes.size(), name.c_str(),
                  hok ? h.level_ms[level] : -1.0, tcp_ms, torch_ms, ratio, tcp_ratio,
                  h.rss_growth_kb);
    }
  }
  std::printf(
      "hsgd: allreduce over shared memory within the node (the default); tcp: the same with "
      "HSGD_SHM=0 (Gloo's TCP transport, like torch)\nratio = hsgd / torch, tcp ratio = tcp / "
      "torch (lower is better); RSS growth over the timed calls of one rank (max over ranks)\n");
  return failures == 0 ? 0 : 1;
}
