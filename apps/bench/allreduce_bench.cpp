// allreduce_bench: latency and bus bandwidth of allreduce against message size, at several world
// sizes, for
//   hsgd   - hsgd::comm::ProcessGroup::allreduce (worker thread, size-based algorithm choice)
//   hsgd-ring - the same forced to AllreduceAlgorithm::kRing (Gloo's zero-copy unbound ring)
//   ring / chunked / hd - Gloo's algorithm objects driven directly (gloo::AllreduceRing,
//            AllreduceRingChunked, AllreduceHalvingDoubling), built once per size, run() in a loop
//   torch  - PyTorch dist.all_reduce on gloo (apps/bench/allreduce_bench_torch.py,
//   /usr/bin/python3)
// All on 127.0.0.1, float32 sums, one process per rank. Medians (bench_util.h) of rank 0's
// per-iteration times.
// busbw = bytes / time * 2 (p - 1) / p (the nccl-tests convention).
//
//   allreduce_bench [--quick] [--ranks 2,4,8] [--no-torch]

#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "apps/bench/bench_util.h"
#include "comm/process_group/process_group.h"
#include "comm/store/file_store.h"
#include "comm/store/gloo_store.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace comm = hsgd::comm;

struct Row {
  std::map<std::string, double> median_us;  // impl -> median time
};

int iterations(size_t bytes, bool quick) {
  if (bytes <= 64 * 1024) return quick ? 50 : 200;
  if (bytes <= 1024 * 1024) return quick ? 10 : 40;
  const int n = static_cast<int>((256u << 20) / bytes);
  return std::clamp(n, quick ? 3 : 5, quick ? 5 : 20);
}

template <typename Run>
double time_median(int iters, Run&& run) {
  for (int i = 0; i < 2; ++i) run();  // warm-up: connections, page faults, caches
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    const auto start = Clock::now();
    run();
    times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  return median(times);
}

// One rank of one world size: measures every implementation at every size; returns, on rank 0,
// one "impl bytes median_us" line per implementation and size.
std::string run_rank(int rank, int world, const std::filesystem::path& dir,
                     const std::vector<size_t>& sizes, bool quick) {
  auto store = std::make_shared<comm::FileStore>(dir);
  auto pg = comm::init_process_group(
      {.rank = rank, .world_size = world, .store = store, .timeout = std::chrono::seconds(120)});
  // hsgd with shared memory off: kAuto over Gloo's TCP transport, as between nodes.
  auto pg_tcp = comm::init_process_group({.rank = rank,
                                          .world_size = world,
                                          .store = store,
                                          .key_prefix = "tcp/",
                                          .timeout = std::chrono::seconds(120),
                                          .shared_memory = false});
  // hsgd forced to Gloo's unbound-buffer ring (zero copy), to document the kAuto choice.
  auto pg_ring = comm::init_process_group({.rank = rank,
                                           .world_size = world,
                                           .store = store,
                                           .key_prefix = "ring/",
                                           .timeout = std::chrono::seconds(120),
                                           .allreduce_algorithm = comm::AllreduceAlgorithm::kRing});
  // Raw Gloo: its own context of the same type (rendezvous::Context over TCP), own device.
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, world);
  context->setTimeout(std::chrono::seconds(120));
  auto gloo_store = comm::as_gloo_store(store, "raw/", std::chrono::seconds(120));
  context->connectFullMesh(*gloo_store, device);

  std::ostringstream results;
  for (size_t bytes : sizes) {
    const size_t n = std::max<size_t>(1, bytes / sizeof(float));
    const int iters = iterations(bytes, quick);
    std::vector<float> data(n, 1.0f);
    std::map<std::string, double> t;
    t["hsgd"] = time_median(iters, [&] { pg->allreduce(std::span<float>(data))->wait(); });
    t["hsgd_tcp"] = time_median(iters, [&] { pg_tcp->allreduce(std::span<float>(data))->wait(); });
    t["hsgd_ring"] =
        time_median(iters, [&] { pg_ring->allreduce(std::span<float>(data))->wait(); });
    const std::vector<float*> ptrs{data.data()};
    {
      gloo::AllreduceRing<float> algo(context, ptrs, static_cast<int>(n));
      t["ring"] = time_median(iters, [&] { algo.run(); });
    }
    {
      gloo::AllreduceRingChunked<float> algo(context, ptrs, static_cast<int>(n));
      t["chunked"] = time_median(iters, [&] { algo.run(); });
    }
    {
      gloo::AllreduceHalvingDoubling<float> algo(context, ptrs, static_cast<int>(n));
      t["hd"] = time_median(iters, [&] { algo.run(); });
    }
    pg->barrier()->wait();
    if (rank == 0) {
      for (auto& [impl, us] : t) results << impl << " " << bytes << " " << us << "\n";
    }
  }
  return results.str();
}

// Forks the ranks of one world size; returns bytes -> implementation -> median us.
std::map<size_t, Row> run_world(int world, const std::vector<size_t>& sizes, bool quick) {
  const auto dir =
      std::filesystem::temp_directory_path() /
      ("hsgd_allreduce_bench_" + std::to_string(::getpid()) + "_" + std::to_string(world));
  std::filesystem::remove_all(dir);
  std::vector<std::string> out;
  try {
    out = run_forked_ranks(world, std::chrono::minutes(20), "world " + std::to_string(world),
                           [&](int rank) { return run_rank(rank, world, dir, sizes, quick); });
  } catch (...) {
    std::filesystem::remove_all(dir);
    throw;
  }
  std::filesystem::remove_all(dir);
  std::map<size_t, Row> rows;
  std::istringstream in(out[0]);
  std::string impl;
  size_t bytes = 0;
  double us = 0;
  while (in >> impl >> bytes >> us) rows[bytes].median_us[impl] = us;
  return rows;
}

// Runs the PyTorch script; returns bytes -> median us (empty, after printing why, on failure).
std::map<size_t, double> run_torch(const std::string& script, int world,
                                   const std::vector<size_t>& sizes, bool quick) {
  std::string sizes_arg, iters_arg;
  for (size_t b : sizes) {
    sizes_arg += (sizes_arg.empty() ? "" : ",") + std::to_string(b);
    iters_arg += (iters_arg.empty() ? "" : ",") + std::to_string(iterations(b, quick));
  }
  std::map<size_t, double> result;
  try {
    const auto lines = run_python_results(
        script, {"--ranks", std::to_string(world), "--sizes", sizes_arg, "--iters", iters_arg},
        1200);
    for (const auto& fields : lines) result[std::stoull(fields.at(0))] = std::stod(fields.at(1));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: PyTorch column skipped: %s\n", e.what());
    result.clear();
  }
  return result;
}

std::string human_bytes(size_t b) {
  if (b >= (1u << 20)) return std::to_string(b >> 20) + " MiB";
  if (b >= 1024) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"allreduce latency and bus bandwidth: hsgd vs raw Gloo vs PyTorch"};
  bool quick = false, no_torch = false;
  std::vector<int> worlds{2, 4, 8};
  size_t min_bytes = 4, max_bytes = 64u << 20;
  app.add_flag("--quick", quick,
               "fewer sizes and iterations (4 B, 64 KiB, 1 MiB, 16 MiB; 2 and 4 ranks)");
  app.add_flag("--no-torch", no_torch, "skip the PyTorch column");
  app.add_option("--ranks", worlds, "world sizes")->delimiter(',');
  app.add_option("--min-bytes", min_bytes, "smallest message");
  app.add_option("--max-bytes", max_bytes, "largest message");
  std::string torch_script = HSGD_BENCH_DIR "/allreduce_bench_torch.py";
  app.add_option("--torch-script", torch_script, "path of allreduce_bench_torch.py");
  CLI11_PARSE(app, argc, argv);

  std::vector<size_t> sizes;
  if (quick) {
    sizes = {4, 64 << 10, 1 << 20, 16 << 20};
    if (app.count("--ranks") == 0) worlds = {2, 4};
  } else {
    for (size_t b = min_bytes; b <= max_bytes; b *= 4) sizes.push_back(b);
  }

  std::printf("allreduce_bench: float32 sum on 127.0.0.1, medians of rank 0 (us), busbw GB/s\n");
  std::printf("%5s %9s | %9s %9s %9s | %9s %9s %9s | %9s | %8s %8s | %9s %9s %10s\n", "ranks",
              "bytes", "hsgd", "hsgd-tcp", "hsgd-ring", "ring", "chunked", "hd", "torch", "hsgd bw",
              "gloo bw", "hsgd/gloo", "tcp/gloo", "torch/hsgd");
  for (int world : worlds) {
    std::map<size_t, Row> rows;
    try {
      rows = run_world(world, sizes, quick);
    } catch (const hsgd::Error& e) {
      std::fprintf(stderr, "world %d failed: %s\n", world, e.what());
      return 1;
    }
    const auto torch =
        no_torch ? std::map<size_t, double>{} : run_torch(torch_script, world, sizes, quick);
    for (auto& [b, row] : rows) {
      auto& t = row.median_us;
      const double best_gloo = std::min({t["ring"], t["chunked"], t["hd"]});
      const double factor = 2.0 * (world - 1) / world;
      auto busbw = [&](double time_us) { return b / (time_us * 1e-6) * factor / 1e9; };
      const double torch_us = torch.count(b) ? torch.at(b) : 0.0;
      std::printf(
          "%5d %9s | %9.1f %9.1f %9.1f | %9.1f %9.1f %9.1f | %9.1f | %8.3f %8.3f | %9.3f %9.3f "
          "%10.3f\n",
          world, human_bytes(b).c_str(), t["hsgd"], t["hsgd_tcp"], t["hsgd_ring"], t["ring"],
          t["chunked"], t["hd"], torch_us, busbw(t["hsgd"]), busbw(best_gloo),
          t["hsgd"] / best_gloo, t["hsgd_tcp"] / best_gloo,
          torch_us > 0 ? torch_us / t["hsgd"] : 0.0);
      std::fflush(stdout);
    }
  }
  std::printf(
      "hsgd: default (shared memory within the node); hsgd-tcp: HSGD_SHM=0, Gloo's TCP as between\n"
      "nodes; hsgd-ring: forced Gloo ring. hsgd/gloo and tcp/gloo: time over the fastest raw Gloo\n"
      "algorithm (lower is better); torch/hsgd: PyTorch time over hsgd time (above 1 = hsgd "
      "faster).\n");
  return 0;
}
