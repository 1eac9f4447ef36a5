#pragma once
// The training loop of the bundled examples (train_mlp, train_resnet): epochs of SGD steps over
// a DataLoader with checkpoints, progress and metrics, evaluations of the average of the
// replicas, and the final report.
//
// Usage:
//   apps::TrainingFlags training_flags;   // parsed by add_training_flags (training_flags.h)
//   apps::ParallelFlags parallel_flags;   // parsed by add_parallel_flags (parallel_training.h)
//   apps::TrainingRun run{.program = "train_resnet", .world = world, .model = model,
//                         .optimizer = optimizer.get(), .loader = &loader, .test = dataset.get()};
//   const apps::EvalResult result = apps::train(training_flags, run);
//   apps::print_report(run, parallel_flags, result, /*wall_seconds=*/61.5);
//
// Per epoch: loader.set_epoch(epoch), then for each batch zero_grad, forward (through DDP when
// the run has it), cross-entropy, backward, optimizer step, scheduler step; the run stops after
// planned_steps() steps. Rank 0 prints the table
//   epoch   steps train_loss train_acc  test_loss  test_acc   time_s  images/s
// with one row per epoch: training loss and accuracy over all ranks' examples, the test loss and
// accuracy of the average of the replicas (evaluated on rank 0; every rank restores its own
// parameters, except after the last epoch, when every rank keeps the average), the epoch's time
// and the job's training throughput. --eval-every N evaluates the same way every N steps within
// an epoch; the clock behind the "eval:" lines and train_s stops while the replicas are averaged
// and evaluated and restarts after a barrier of all ranks.
//
// Preemption: with --checkpoint-dir, SIGUSR1 or SIGTERM stop every rank at the same step
// boundary (at most one step after the signal reached any rank), after a checkpoint of that step
// (apps/common/preemption.h); rank 0 prints "preempted (SIGUSR1): stopped at step S of T after a
// checkpoint in DIR/step_S; ..." and train_and_report returns comm::launcher::kExitPreempted.
//
// Resume: the run first loads a checkpoint as --checkpoint-dir/--resume say (RunCheckpoints); a
// checkpoint taken at the end of an epoch resumes at the start of the next.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "apps/common/checkpointing.h"
#include "apps/common/parallel_training.h"
#include "apps/common/training_flags.h"
#include "apps/common/training_reporter.h"
#include "comm/process_group/process_group.h"
#include "framework/data/data_loader.h"
#include "framework/data/dataset.h"
#include "framework/nn/module.h"
#include "framework/train/optimizer.h"
#include "optim/lr_scheduler.h"

namespace hsgd::apps {

// Loss and accuracy of model on the first max_examples (0: all) examples of test, in eval mode
// and without gradients; the model is back in train mode afterwards.
EvalResult evaluate(nn::Module& model, const data::Dataset& test, int64_t max_examples);
// The same over one shard of those examples, the ones whose index i has i % shards == shard,
// summed rather than averaged: loss and accuracy times the examples, and their count in
// `examples` (for an allreduce over the ranks that evaluate a shard each).
EvalResult evaluate_shard(nn::Module& model, const data::Dataset& test, int64_t max_examples,
                          int shard, int shards, int64_t& examples);

// What train() trains; nothing is owned, everything outlives the call.
struct TrainingRun {
  std::string program;  // prefixes the report lines: "train_mlp"
  std::shared_ptr<comm::ProcessGroup> world;
  std::shared_ptr<nn::Module> model;
  const Parallel* parallel = nullptr;
  Optimizer* optimizer = nullptr;           // the wrapped one
  optim::LRScheduler* scheduler = nullptr;  // null: constant lr
  data::DataLoader* loader = nullptr;
  const data::Dataset* test = nullptr;
  RunCheckpoints* checkpoints = nullptr;
  bool distributed = false;  // print the wall time line of the report
};

// How train() ended: the steps trained in all (resumed ones included), and whether it stopped
// early on a preemption signal (apps/common/preemption.h) after a checkpoint of that step.
struct TrainingEnd {
  int64_t step = 0;
  bool preempted = false;
};

// Trains as the file comment says (collective over run.world); returns rank 0's last
// evaluation (other ranks get zeros; nothing evaluated when preempted). end, if given, says how
// the run ended.
EvalResult train(const TrainingFlags& flags, const TrainingRun& run, TrainingEnd* end = nullptr);

// Rank 0: "final test accuracy: A%", in a distributed run "<program>: W ranks, mode M, training
// wall time T s (rank 0)", and the averager's level_stats() table.
void print_report(const TrainingRun& run, const ParallelFlags& parallel, const EvalResult& result,
                  double wall_seconds);

// What both examples do once everything is built: train(), print_report() with the wall time,
// then shut the world group down (no rank leaves while a peer may still have a collective in
// flight). Returns the exit code: 0, or comm::launcher::kExitPreempted (75) when preempted (no
// report then).
int train_and_report(const TrainingFlags& flags, const TrainingRun& run,
                     const ParallelFlags& parallel);

}  // namespace hsgd::apps
