#pragma once
// The training flags the bundled examples (train_mlp, train_resnet) share: the optimizer
// (--optimizer sgd with --momentum/--nesterov, or adamw with --beta1/--beta2/--eps; both take
// --lr and --weight-decay, L2 for SGD and decoupled for AdamW), schedule,
// epochs, batch size, seed, step limit, training subset, progress, evaluation and metrics.
// Each program sets its own defaults in the struct before add_training_flags, which shows them
// in --help.
//
// Usage:
//   CLI::App app{"train_resnet"};
//   apps::TrainingFlags training{.batch_size = 128, .lr = 0.1, .weight_decay = 1e-4};
//   apps::add_training_flags(app, training);
//   // ... parse ...
//   apps::check_training_flags(training);                   // after parsing
//   auto sgd = std::make_shared<optim::SGD>(params, apps::sgd_options(training));
//   std::shared_ptr<Optimizer> opt = apps::make_optimizer(training, params);   // per --optimizer
//
// Bad values throw InvalidArgument naming the flag (exit code 1 in the examples).

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "framework/data/data_loader.h"
#include "framework/train/optimizer.h"
#include "optim/adam.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"

namespace hsgd::apps {

struct TrainingFlags {
  int64_t epochs = 1;
  int64_t batch_size = 64;                        // per rank
  double lr = 0.05;                               // per rank, as with torch DDP
  std::string optimizer = "sgd";                  // sgd | adamw
  double momentum = 0.9;                          // sgd
  double weight_decay = 0;                        // sgd: L2 penalty; adamw: decoupled decay
  bool nesterov = false;                          // sgd
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adamw
  std::string schedule = "cosine";  // cosine (annealed to 0 over the run, per step) | constant
  uint64_t seed = 0;                // initialisation, shuffle and augmentation
  int threads = 0;  // intra-op threads (hsgd::set_num_threads); 0: HSGD_NUM_THREADS, else all cores
  int64_t max_steps = 0;              // 0: epochs * batches per epoch
  int64_t train_subset = 0;           // 0: the whole training set, else its first N examples
  bool allow_nonfinite_loss = false;  // else a NaN/inf training loss stops the run
  int64_t log_every = 50;             // progress line / metrics record every N steps; 0: none
  int64_t eval_every = 0;             // 0: evaluate at epoch ends only, print no "eval:" lines
  int64_t max_eval = 0;               // test examples per evaluation; 0: all
  std::string metrics_out = "";       // JSON lines file written by rank 0; empty: none
  int64_t prefetch = 2;               // batches loaded ahead on a background thread; 0: off
};

void add_training_flags(CLI::App& app, TrainingFlags& flags);

// InvalidArgument naming the flag for a value out of range.
void check_training_flags(const TrainingFlags& flags);

// Sets hsgd's intra-op thread count (kernels and BLAS) from --threads when it is not 0; with 0,
// decides it from the environment now (InvalidArgument naming a bad HSGD_NUM_THREADS).
void apply_thread_flag(const TrainingFlags& flags);

optim::SGDOptions sgd_options(const TrainingFlags& flags);
optim::AdamWOptions adamw_options(const TrainingFlags& flags);

// optim::SGD or optim::AdamW over params, as --optimizer says.
std::shared_ptr<Optimizer> make_optimizer(const TrainingFlags& flags, std::vector<Tensor> params);

// "SGD momentum 0.9 nesterov, weight decay 0.0001" / "AdamW betas 0.9/0.999, eps 1e-08, weight
// decay 0.01", for the programs' first line.
std::string describe_optimizer(const TrainingFlags& flags);

// CosineAnnealingLR over the run's planned_steps for --schedule cosine; null for constant.
std::unique_ptr<optim::LRScheduler> make_scheduler(const TrainingFlags& flags, Optimizer& optimizer,
                                                   int64_t planned_steps);

}  // namespace hsgd::apps
