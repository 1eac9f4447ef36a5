// train_mlp: trains an MLP classifier on Fashion-MNIST (or a synthetic data set), in one process
// or data-parallel under hsgd-run, and prints, per epoch, the training loss and accuracy, the
// test loss and accuracy, the time taken and the throughput. The training flags, the progress
// line, --metrics-out and the final report are shared with train_resnet (apps/common/
// training_flags.h, training_run.h); the loop is the library's runtime (framework/runtime/).
//
//   train_mlp --epochs 1                # 784-512-256-10 on /usr/share/datasets/fashion-mnist
//   train_mlp --synthetic --epochs 3    # no data files needed
//   train_mlp --optimizer adamw --lr 1e-3 --weight-decay 0.01   # AdamW instead of SGD
//   hsgd-run --nproc-per-node 4 -- train_mlp --mode ddp
//   hsgd-run --nproc-per-node 4 -- train_mlp --mode local-sgd --period 4 --warmup-steps 50
//   hsgd-run --nproc-per-node 4 -- train_mlp --mode hierarchical --hierarchy 2:2,4:4
//
// Distributed behaviour: init_process_group(InitOptions::from_env()); without RANK (no hsgd-run)
// it is a world of one and the program behaves exactly as a plain single-process run (no DDP
// wrapper in --mode ddp). With W ranks every rank trains on its 1/W shard of the training set
// (DataLoader rank/world_size, same seed: the same shuffle, disjoint shards); --batch-size and
// --lr are per rank, as with torch DDP (the global batch is W * batch-size).
//   --mode ddp           DistributedDataParallel, gradients averaged over all ranks every step.
//   --mode local-sgd     DDP with post_localSGD_hook(start_localSGD_iter = --warmup-steps; then
//                        gradients averaged within the intra-node group: LOCAL_WORLD_SIZE
//                        contiguous ranks, or each node's ranks when nodes run different
//                        numbers) + PeriodicModelAverager(--period, --warmup-steps), wired through
//                        optim::PostLocalSGDOptimizer.
//   --mode hierarchical  the same hook + HierarchicalModelAverager(--hierarchy, --warmup-steps);
//                        group sizes are numbers, 'world' or 'node' (each node's ranks).
// --subgroup-size N replaces the intra-node group as the post-local gradient group (1: no gradient
// communication after warm-up, i.e. pure local SGD). On ONE node the intra-node group is the
// whole world, so the replicas stay identical and averaging changes nothing (it only costs
// time), as in PyTorch, and a 'node' level is the whole world (the levels above it are dropped);
// both warn. To test a hierarchy on one machine, --emulated-node-size N treats each block of N
// contiguous ranks as a node, for the post-local gradient group and for 'node' levels:
//   hsgd-run --nproc-per-node 4 -- train_mlp --synthetic --mode hierarchical
//       --hierarchy 2:node,8:world --emulated-node-size 2      (one command line)
// runs as 2 nodes of 2 (add --subgroup-size 1 for local SGD within the emulated nodes too).
// --emulated-node-size must be at least 1, divide the number of ranks and come with --mode
// local-sgd or hierarchical (exit code 2 otherwise, naming the value).
// Evaluation: at the end of each epoch the ranks' parameters are averaged into a temporary
// copy (one allreduce per tensor), rank 0 evaluates that averaged model on the full test set,
// and every rank restores its own parameters, so evaluation does not perturb training. After
// the last epoch the averaged model is kept on every rank. Only rank 0 prints; at the end it
// prints the averager's level_stats() (averagings, MB and seconds per level).
// --eval-every N also evaluates (the same way) every N steps within an epoch and prints, at each
// evaluation including the epoch ends, a line
//   eval: epoch E step S train_s T test_accuracy A%
// where S counts steps since the start and T is rank 0's training time so far WITHOUT the
// evaluations: the clock stops while the replicas are averaged and evaluated and restarts after
// a barrier of all ranks, so no rank trains while rank 0 evaluates (for accuracy-vs-time plots).
//
// Exit code 0 on success, 1 on a bad flag value or unreadable data (the message names it),
// 2 on a malformed or invalid --hierarchy.

#include <cblas.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/common/checkpointing.h"
#include "apps/common/parallel_training.h"
#include "apps/common/run_main.h"
#include "apps/common/training_flags.h"
#include "apps/common/training_run.h"
#include "comm/error.h"
#include "framework/data/data_loader.h"
#include "framework/data/fashion_mnist.h"
#include "framework/data/subset.h"
#include "framework/data/synthetic_dataset.h"
#include "models/mlp.h"

namespace {

using namespace hsgd;

struct Flags {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::vector<int64_t> hidden = {512, 256};
  bool synthetic = false;
  apps::TrainingFlags training{.batch_size = 64, .lr = 0.05, .schedule = "cosine"};
  apps::ParallelFlags parallel;
  apps::CheckpointFlags checkpoint;
};

struct Data {
  std::shared_ptr<const data::Dataset> train, test;
  int64_t num_classes = 0;
};

Data load_data(const Flags& flags) {
  Data out;
  if (flags.synthetic) {
    data::SyntheticOptions options{.size = 8192,
                                   .example_shape = {1, 28, 28},
                                   .num_classes = 10,
                                   .noise = 4.0f,
                                   .seed = flags.training.seed};
    out.train = std::make_shared<data::SyntheticDataset>(options);
    options.size = 2048;
    // Same seed: the same class centroids; a different noise stream is not needed for a demo.
    out.test = std::make_shared<data::SyntheticDataset>(options);
    out.num_classes = 10;
  } else {
    const data::FashionMNISTOptions options{.normalize = true};
    out.train = std::make_shared<data::FashionMNIST>(flags.data_dir,
                                                     data::FashionMNIST::Split::kTrain, options);
    out.test = std::make_shared<data::FashionMNIST>(flags.data_dir,
                                                    data::FashionMNIST::Split::kTest, options);
    out.num_classes = data::FashionMNIST::kNumClasses;
  }
  if (flags.training.train_subset > 0) {
    out.train = data::first_n(out.train, flags.training.train_subset);
  }
  return out;
}

// Input, hidden and output sizes.
std::vector<int64_t> mlp_sizes(const Flags& flags, const Data& data) {
  std::vector<int64_t> sizes = {shape_numel(data.train->example_shape())};
  sizes.insert(sizes.end(), flags.hidden.begin(), flags.hidden.end());
  sizes.push_back(data.num_classes);
  return sizes;
}

int run(const Flags& flags) {
  const apps::TrainingFlags& training = flags.training;
  apps::check_training_flags(training);
  apps::apply_thread_flag(training);
  const Data data = load_data(flags);
  const std::vector<int64_t> sizes = mlp_sizes(flags, data);
  auto model =
      std::make_shared<models::MLP>(models::MLPOptions{.sizes = sizes, .seed = training.seed});
  std::string arch;
  for (size_t i = 0; i < sizes.size(); ++i) arch += (i ? "-" : "") + std::to_string(sizes[i]);
  return apps::train_and_report(
      training, flags.parallel, flags.checkpoint,
      {.program = "train_mlp",
       .model = model,
       .train = data.train,
       .test = data.test,
       .loader = {.batch_size = training.batch_size,
                  .shuffle = true,
                  .seed = training.seed,
                  .prefetch = training.prefetch},
       .model_name = "mlp " + arch,
       .print_header = [&](const runtime::GenerationEvent& e) {
         std::printf(
             "train_mlp: MLP %s, %s: %lld train / %lld test examples, batch %lld, lr %g, "
             "%s, %s lr, %d BLAS threads\n",
             arch.c_str(), flags.synthetic ? "synthetic data" : flags.data_dir.c_str(),
             static_cast<long long>(data.train->size()), static_cast<long long>(data.test->size()),
             static_cast<long long>(training.batch_size), training.lr,
             apps::describe_optimizer(training).c_str(), training.schedule.c_str(),
             openblas_get_num_threads());
         if (e.world_size > 1 || flags.parallel.mode != "ddp") {
           std::printf("train_mlp: %s, %lld batches per rank per epoch\n",
                       apps::describe_parallel(flags.parallel, e.world_size, *e.parallel).c_str(),
                       static_cast<long long>(e.batches_per_epoch));
         }
       }});
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{
      "Train an MLP classifier on Fashion-MNIST, in one process or data-parallel under hsgd-run "
      "(DDP, post-local SGD, hierarchical model averaging)."};
  app.add_option("--data-dir", flags.data_dir, "Directory with the Fashion-MNIST IDX files")
      ->capture_default_str();
  app.add_flag("--synthetic", flags.synthetic, "Use a synthetic data set instead of files");
  app.add_option("--hidden", flags.hidden, "Hidden layer sizes, e.g. 512,256")
      ->delimiter(',')
      ->capture_default_str();
  // The batch-64 GEMMs of this model are too small to gain from threads; on a busy 2-core
  // machine OpenBLAS's spinning threads made an epoch 4x slower (45 s vs 11 s wall).
  flags.training.threads = 1;
  apps::add_training_flags(app, flags.training);
  apps::add_parallel_flags(app, flags.parallel);
  apps::add_checkpoint_flags(app, flags.checkpoint);
  return apps::run_main(app, argc, argv, "train_mlp", [&] { return run(flags); });
}
