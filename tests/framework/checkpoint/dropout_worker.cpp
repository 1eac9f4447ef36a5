// dropout_worker: a training program with nn::Dropout for dropout_resume_test.sh, run under
// hsgd-run. Each rank trains its own Linear-ReLU-Dropout-Linear on its shard of a synthetic data
// set (no gradient communication: each rank's result depends on its own dropout stream only),
// checkpoints every EVERY steps into DIR and at the end, and resumes from the newest complete
// checkpoint in DIR when there is one. Rank 0 prints "step N" after each step and
// "resumed from step N" after a resume.
//
//   dropout_worker DIR STEPS EVERY SEED [SLEEP_MS]
//
// SEED seeds the dropout streams (SEED + rank) and the data order; SLEEP_MS (default 0) is slept
// after each step so that a test can kill the run mid-way. The Checkpointer's RunInfo leaves
// local_world_size to the process group. Exit status 0, or 1 with the error on stderr.

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "comm/process_group/init.h"
#include "comm/process_group/process_group.h"
#include "framework/checkpoint/checkpointer.h"
#include "framework/data/data_loader.h"
#include "framework/data/synthetic_dataset.h"
#include "framework/nn/activation.h"
#include "framework/nn/dropout.h"
#include "framework/nn/functional.h"
#include "framework/nn/linear.h"
#include "framework/nn/sequential.h"
#include "optim/sgd.h"

namespace {

using namespace hsgd;

int run(const std::string& dir, int64_t steps, int64_t every, uint64_t seed, int sleep_ms) {
  const std::shared_ptr<comm::ProcessGroup> world =
      comm::init_process_group(comm::InitOptions::from_env());
  const int rank = world->rank();
  Generator init(1);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Linear>(16, 32, true, init));
  model->push_back(std::make_shared<nn::ReLU>());
  model->push_back(std::make_shared<nn::Dropout>(0.5, seed + static_cast<uint64_t>(rank)));
  model->push_back(std::make_shared<nn::Linear>(32, 4, true, init));
  auto sgd = std::make_shared<optim::SGD>(model->parameters(),
                                          optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  auto dataset = std::make_shared<data::SyntheticDataset>(
      data::SyntheticOptions{.size = 256, .example_shape = {16}, .num_classes = 4});
  data::DataLoader loader(
      dataset,
      {.batch_size = 8, .shuffle = true, .seed = seed, .rank = rank, .world_size = world->size()});

  checkpoint::Checkpointer ckpt({.dir = dir}, world, {.mode = "local", .model = "dropout-net"});
  ckpt.add_module("model", model);
  ckpt.add("optimizer", sgd);
  ckpt.add("loader", loader);
  int64_t step = 0;
  if (const auto resumed = ckpt.load()) {
    step = resumed->step;
    if (rank == 0) std::printf("resumed from step %lld\n", static_cast<long long>(step));
  }
  while (step < steps) {
    loader.set_epoch(loader.epoch());
    for (const data::Batch& batch : loader) {
      sgd->zero_grad();
      nn::cross_entropy(model->forward(batch.inputs), batch.targets).backward();
      sgd->step();
      ++step;
      if (step % every == 0 || step == steps) ckpt.save(step);
      if (rank == 0) {
        std::printf("step %lld\n", static_cast<long long>(step));
        std::fflush(stdout);
      }
      if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
      if (step == steps) break;
    }
    if (step < steps) loader.set_epoch(loader.epoch() + 1);
  }
  ckpt.wait();
  world->shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5 || argc > 6) {
    std::fprintf(stderr, "usage: dropout_worker DIR STEPS EVERY SEED [SLEEP_MS]\n");
    return 1;
  }
  try {
    return run(argv[1], std::stoll(argv[2]), std::stoll(argv[3]), std::stoull(argv[4]),
               argc == 6 ? std::stoi(argv[5]) : 0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dropout_worker: error: %s\n", e.what());
    return 1;
  }
}
