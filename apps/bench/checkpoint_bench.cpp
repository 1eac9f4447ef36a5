// checkpoint_bench: what a checkpoint costs a training run, for MLP 784-512-256-10, ResNet-20 and
// ResNet-18 sized states (the model's parameters and buffers plus SGD's momentum buffers, as a
// Checkpointer with add_module("model") + add("optimizer") holds them), one process.
//
// Per checkpoint (median, bench_util.h, of --rounds):
//   stall     Checkpointer::save() until it returns: the snapshot (SaveStats::snapshot_seconds)
//             plus waking the writer thread; the time training waits
//   opt sd    of the snapshot: SGD::state_dict() alone (the optimizer clones its momentum
//             buffers itself; the Checkpointer copies module tensors into a reused arena)
//   write     SaveStats::write_seconds: encode + write + fsync of the rank file, in the
//             background (the manifest and pruning follow; "bg" is the whole background time)
//   memcpy    a plain memcpy of the same tensors into one preallocated, already-touched buffer
//   torch     torch.save of equally shaped tensors to a file in the same directory
//             (apps/bench/checkpoint_bench_torch.py, /usr/bin/python3), with the same
//             temporary file + fsync + rename + directory fsync protocol ("fsync"), and a plain
//             torch.save(state, path) without fsync ("nosync")
// Targets: stall <= 2x memcpy (training waits little more than a copy of its state); write within
// 1.5x of torch.save with fsync (both then wait for the disk). Tests never assert on these times.
//
//   checkpoint_bench [--rounds 7] [--dir PARENT] [--models mlp,resnet20,resnet18] [--no-torch]

#include <sys/statfs.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "apps/bench/bench_util.h"
#include "comm/process_group/init.h"
#include "framework/checkpoint/checkpointer.h"
#include "framework/nn/functional.h"
#include "framework/tensor/ops.h"
#include "models/registry.h"
#include "optim/sgd.h"

namespace {

namespace fs = std::filesystem;
using namespace hsgd;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string file_system_of(const std::string& dir) {
  struct statfs s {};
  if (::statfs(dir.c_str(), &s) != 0) return "unknown";
  switch (static_cast<unsigned long>(s.f_type)) {
    case 0xEF53:
      return "ext4";
    case 0x01021994:
      return "tmpfs";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x794C7630:
      return "overlayfs";
    default: {
      char hex[32];
      std::snprintf(hex, sizeof hex, "0x%lx", static_cast<unsigned long>(s.f_type));
      return hex;
    }
  }
}

struct Result {
  std::string name;
  double mb = 0, file_mb = 0;
  double stall = 0, snapshot = 0, write = 0, background = 0, memcpy = 0;
  double optimizer_state = 0;  // of the snapshot: SGD::state_dict() (its own clones)
  bool torch_ok = false;
  double torch_fsync = 0, torch_nosync = 0, torch_file_mb = 0;
};

// The state of a training run: the model after one SGD step with momentum (so every momentum
// buffer exists).
struct Workload {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<optim::SGD> sgd;
};

Workload make_workload(const std::string& name) {
  Workload w;
  const bool mlp = name == "mlp";
  w.model = models::make_model(
      name, {.input_shape = mlp ? Shape{1, 28, 28} : Shape{3, 32, 32}, .mlp_hidden = {512, 256}});
  w.sgd = std::make_unique<optim::SGD>(w.model->parameters(),
                                       optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
  Generator gen(1);
  const Tensor x = randn(mlp ? Shape{2, 1, 28, 28} : Shape{2, 3, 32, 32}, gen);
  w.sgd->zero_grad();
  nn::cross_entropy(w.model->forward(x), {1, 2}).backward();
  w.sgd->step();
  return w;
}

// Every tensor the Checkpointer snapshots, by its checkpoint key.
std::vector<std::pair<std::string, Tensor>> checkpointed_tensors(const Workload& w) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [key, t] : w.model->state_dict()) out.emplace_back("model." + key, t);
  const StateDict optimizer = w.sgd->state_dict();
  for (const auto& [key, value] : optimizer.entries()) {
    if (const Tensor* t = std::get_if<Tensor>(&value)) out.emplace_back("optimizer." + key, *t);
  }
  return out;
}

bool run_torch(const std::string& script, const std::string& dir,
               const std::vector<std::pair<std::string, Tensor>>& tensors, int rounds,
               Result& out) {
  const std::string spec = dir + "/torch_spec.txt";
  {
    std::ofstream f(spec);
    for (const auto& [key, t] : tensors) {
      f << key;
      for (int64_t d : t.shape()) f << " " << d;
      f << "\n";
    }
  }
  bool ok = false;
  try {
    const auto results = run_python_results(
        script, {"--spec", spec, "--dir", dir, "--rounds", std::to_string(rounds)}, 600);
    const std::vector<std::string>& fields = results.back();
    out.torch_nosync = std::stod(fields.at(0));
    out.torch_fsync = std::stod(fields.at(1));
    out.torch_file_mb = std::stod(fields.at(2)) / 1e6;
    ok = true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_bench: PyTorch column skipped: %s\n", e.what());
  }
  fs::remove(spec);
  return ok;
}

Result bench(const std::string& name, const std::string& label, const std::string& root, int rounds,
             bool torch, const std::string& script) {
  Workload w = make_workload(name);
  const std::vector<std::pair<std::string, Tensor>> tensors = checkpointed_tensors(w);
  Result r{.name = label};
  size_t bytes = 0;
  for (const auto& [key, t] : tensors) bytes += static_cast<size_t>(t.numel()) * sizeof(float);
  r.mb = static_cast<double>(bytes) / 1e6;

  // memcpy into a preallocated buffer, touched once so that no page faults are timed.
  std::vector<char> buffer(bytes, 1);
  std::vector<double> memcpy_ms;
  for (int i = 0; i < rounds + 1; ++i) {
    const auto start = Clock::now();
    size_t offset = 0;
    for (const auto& [key, t] : tensors) {
      const size_t n = static_cast<size_t>(t.numel()) * sizeof(float);
      std::memcpy(buffer.data() + offset, t.data(), n);
      offset += n;
    }
    if (i > 0) memcpy_ms.push_back(ms_since(start));  // the first round warms the caches
  }
  r.memcpy = median(memcpy_ms);
  std::vector<double> optimizer_ms;
  for (int i = 0; i < rounds + 1; ++i) {
    const auto start = Clock::now();
    const StateDict state = w.sgd->state_dict();
    if (i > 0) optimizer_ms.push_back(ms_since(start));
  }
  r.optimizer_state = median(optimizer_ms);

  const std::string dir = root + "/" + name;
  fs::remove_all(dir);
  std::vector<double> stall, snapshot, write, background;
  {
    checkpoint::Checkpointer ckpt({.dir = dir, .keep_last = 2},
                                  comm::init_process_group(comm::InitOptions{}),
                                  {.mode = "ddp", .model = name});
    ckpt.add_module("model", w.model);
    ckpt.add("optimizer", *w.sgd);
    for (int i = 0; i < rounds + 1; ++i) {
      const auto start = Clock::now();
      ckpt.save(i + 1);
      const double stall_ms = ms_since(start);
      const auto returned = Clock::now();
      ckpt.wait();
      const double background_ms = ms_since(returned);
      if (i == 0) continue;  // the first save allocates the snapshot's memory
      const checkpoint::SaveStats& s = ckpt.last_save_stats();
      stall.push_back(stall_ms);
      snapshot.push_back(1e3 * s.snapshot_seconds);
      write.push_back(1e3 * s.write_seconds);
      background.push_back(background_ms);
      r.file_mb = static_cast<double>(s.bytes) / 1e6;
    }
  }
  r.stall = median(stall);
  r.snapshot = median(snapshot);
  r.write = median(write);
  r.background = median(background);
  fs::remove_all(dir);
  if (torch) {
    fs::create_directories(dir);
    r.torch_ok = run_torch(script, dir, tensors, rounds, r);
    fs::remove_all(dir);
  }
  return r;
}

// The script next to this source file.
std::string default_torch_script() { return HSGD_BENCH_DIR "/checkpoint_bench_torch.py"; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Checkpoint cost: hsgd's Checkpointer vs memcpy and torch.save"};
  int rounds = 7;
  std::string parent = fs::temp_directory_path().string();
  std::vector<std::string> names = {"mlp", "resnet20", "resnet18"};
  bool no_torch = false;
  std::string script = default_torch_script();
  app.add_option("--rounds", rounds, "timed checkpoints per state (median)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--dir", parent,
                 "a directory on the file system to measure; the files go to a subdirectory that "
                 "is removed afterwards")
      ->capture_default_str();
  app.add_option("--models", names, "states: mlp, resnet20, resnet18")->delimiter(',');
  app.add_option("--torch-script", script, "the PyTorch side");
  app.add_flag("--no-torch", no_torch, "skip torch.save");
  CLI11_PARSE(app, argc, argv);
  const std::string dir = parent + "/hsgd_checkpoint_bench_" + std::to_string(::getpid());
  fs::create_directories(dir);

  std::printf("checkpoint_bench: %d rounds, median ms per checkpoint, files in %s (%s)\n", rounds,
              dir.c_str(), file_system_of(dir).c_str());
  std::printf("%-22s %7s %8s %8s %8s %8s %8s %8s %9s %9s %7s %7s %7s\n", "state (model+momentum)",
              "MB", "memcpy", "stall", "snapshot", "opt sd", "write", "bg", "torch+fs", "torch",
              "stall/", "write/", "write/");
  std::printf("%-22s %7s %8s %8s %8s %8s %8s %8s %9s %9s %7s %7s %7s\n", "", "", "", "", "", "", "",
              "", "(fsync)", "(nosync)", "memcpy", "t+fs", "t");
  for (const std::string& name : names) {
    const std::string label = name == "mlp" ? "MLP 784-512-256-10" : name;
    const Result r = bench(name, label, dir, rounds, !no_torch, script);
    char torch_fsync[32] = "n/a", torch_nosync[32] = "n/a", ratio_fsync[32] = "n/a",
         ratio_nosync[32] = "n/a";
    if (r.torch_ok) {
      std::snprintf(torch_fsync, sizeof torch_fsync, "%.2f", r.torch_fsync);
      std::snprintf(torch_nosync, sizeof torch_nosync, "%.2f", r.torch_nosync);
      std::snprintf(ratio_fsync, sizeof ratio_fsync, "%.2f", r.write / r.torch_fsync);
      std::snprintf(ratio_nosync, sizeof ratio_nosync, "%.2f", r.write / r.torch_nosync);
    }
    std::printf("%-22s %7.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %9s %9s %7.2f %7s %7s\n",
                r.name.c_str(), r.mb, r.memcpy, r.stall, r.snapshot, r.optimizer_state, r.write,
                r.background, torch_fsync, torch_nosync, r.stall / r.memcpy, ratio_fsync,
                ratio_nosync);
    std::fflush(stdout);
    if (r.torch_ok) {
      std::printf("%-22s file: hsgd %.2f MB, torch %.2f MB\n", "", r.file_mb, r.torch_file_mb);
    }
  }
  std::printf("targets: stall/memcpy <= 2, write/torch.save (fsync) <= 1.5\n");
  fs::remove_all(dir);
  return 0;
}
