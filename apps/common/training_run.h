#pragma once
// How the bundled examples (train_mlp, train_resnet, train_gpt) train: their flags turned into a
// runtime::Runtime (framework/runtime/runtime.h), which owns the loop, the generations of an
// elastic job, checkpoints and preemption; this file owns only the classification (or next-token)
// step, the evaluation of a test set, and what rank 0 prints.
//
// Usage:
//   apps::TrainingFlags training;      // parsed by add_training_flags (training_flags.h)
//   apps::ParallelFlags parallel;      // add_parallel_flags (parallel_training.h)
//   apps::CheckpointFlags checkpoint;  // add_checkpoint_flags (checkpointing.h)
//   return apps::train_and_report(training, parallel, checkpoint,
//                                 {.program = "train_mlp",
//                                  .model = model,
//                                  .train = dataset,
//                                  .test = dataset,
//                                  .loader = {.batch_size = 64, .shuffle = true},
//                                  .model_name = "mlp 784-10"});
//
// Output (rank 0): the program's header (TrainingProgram::print_header), then per epoch
//   epoch   steps train_loss train_acc  test_loss  test_acc   time_s  images/s
// (an elastic run prints "(N ranks)" instead of the time and throughput, a line per generation:
// "train_mlp: generation 2: lost node ...; 1 nodes, 2 workers, at step 412; ...", and a line every
// --log-every steps), the progress line and --metrics-out records (training_reporter.h), and at
// the end "final test accuracy: A% test_loss L" with the averaging table (print_averaging_stats).
// Evaluation averages the replicas (parameters and buffers) and every rank evaluates a shard of the
// test set; after the last epoch every rank keeps the average. Preemption: with --checkpoint-dir,
// SIGUSR1 or SIGTERM stop every rank at the same step after a checkpoint; rank 0 prints "preempted
// (SIGUSR1): stopped at step S of T after a checkpoint in DIR/step_S; ..." and the exit code is
// comm::launcher::kExitPreempted (75). Resume: --resume auto continues from the newest complete
// checkpoint in --checkpoint-dir.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "apps/common/checkpointing.h"
#include "apps/common/parallel_training.h"
#include "apps/common/training_flags.h"
#include "apps/common/training_reporter.h"
#include "framework/data/data_loader.h"
#include "framework/data/dataset.h"
#include "framework/nn/module.h"
#include "framework/runtime/runtime.h"

namespace hsgd::apps {

// A batch's logits as rows (N,C) with their N targets: for class data the model's output and
// batch.targets; for token data (batch.input_ids, a language model's (B,T,V) output) the B*T
// positions with their next tokens (batch.target_ids). forward runs the model on the batch.
struct LogitRows {
  Tensor logits;
  std::vector<int64_t> targets;
};
LogitRows logit_rows(const data::Batch& batch,
                     const std::function<Tensor(const data::Batch&)>& forward);

// Loss and accuracy of model on the examples of test whose index i < max_examples (0: all) has
// i % shards == shard, summed over them (eval mode, no gradients; back in train mode after).
// For token data every position is one example (the next-token loss and accuracy).
runtime::EvalSums evaluate_shard(nn::Module& model, const data::Dataset& test, int64_t max_examples,
                                 int shard, int shards);
// The same over every example, as means.
EvalResult evaluate(nn::Module& model, const data::Dataset& test, int64_t max_examples);

// What an example trains.
struct TrainingProgram {
  std::string program;  // prefixes the report lines: "train_mlp"
  std::shared_ptr<nn::Module> model;
  std::vector<Tensor> average_buffers{};  // averaged with the parameters (BatchNorm statistics)
  std::shared_ptr<const data::Dataset> train;
  std::shared_ptr<const data::Dataset> test;
  data::DataLoaderOptions loader{};  // rank and world_size are set by the runtime
  std::string model_name = "";       // recorded in checkpoints ("resnet20", "mlp 784-10")
  // Rank 0, once the world formed: the program's own first lines.
  std::function<void(const runtime::GenerationEvent&)> print_header = nullptr;
  // Rank 0, after the final lines of a run that ended (not preempted): the program's own last
  // lines (train_gpt's sample of generated text). The model then holds the averaged replicas.
  std::function<void(const runtime::RunResult&)> print_footer = nullptr;
};

// Trains as the file comment says; returns the exit code: 0, or kExitPreempted (75) when
// preempted, or kExitWillRepeat (78) when an elastic node may not join (another configuration)
// or the job lost its state with no checkpoint. Bad flag values throw BadFlag.
int train_and_report(const TrainingFlags& training, const ParallelFlags& parallel,
                     const CheckpointFlags& checkpoint, TrainingProgram program);

}  // namespace hsgd::apps
