#pragma once
// RunListener: what a program hears from its Runtime (runtime.h) while it trains, to print and
// log it (the library prints nothing). Every method is called on every rank, on the training
// thread, in this order: on_generation (once in a fixed-size job) -> (on_step, and at
// evaluations on_eval_begin, on_eval, on_eval_end)* -> on_epoch at each epoch end. A listener
// that throws stops the run with its exception.
//
// Usage:
//   struct Printer : runtime::RunListener {
//     void on_step(const runtime::StepEvent& e) override {
//       if (e.lead && e.step % 100 == 0) std::printf("step %lld loss %.4f\n", e.step, e.loss);
//     }
//   };
//   Printer printer;
//   runtime::Runtime rt({});
//   rt.register_model(model);
//   rt.register_optimizer(optimizer);
//   rt.run(
//       dataset,
//       [](runtime::StepContext& step, const data::Batch& b) {
//         Tensor l = nn::cross_entropy(step.forward(b.inputs), b.targets);
//         l.backward();
//         return l;
//       },
//       &printer);

#include <cstdint>
#include <functional>
#include <string>

#include "framework/data/dataset.h"
#include "framework/distributed/model_averaging/averagers.h"
#include "framework/nn/module.h"
#include "framework/runtime/parallel.h"

namespace hsgd::runtime {

// Loss and accuracy (a fraction) of an evaluation.
struct EvalResult {
  double loss = 0, accuracy = 0;
};

// One rank's share of an evaluation: loss x examples and accuracy x examples summed over the
// examples whose index i has i % shards == shard, and their count.
struct EvalSums {
  double loss_sum = 0, correct = 0;
  int64_t examples = 0;
};
// Evaluates model (the average of the replicas, in eval mode and without gradients) on one
// shard of a test set.
using EvalFn = std::function<EvalSums(nn::Module& model, int shard, int shards)>;

// A generation formed and its members agreed on the state (once in a fixed-size job).
struct GenerationEvent {
  bool lead = false;     // rank 0 of the generation
  bool elastic = false;  // under an elastic hsgd-run
  int64_t number = 0;    // the generation (0 in a fixed-size job)
  int nodes = 1;         // nodes in it (elastic)
  int world_size = 1;
  int64_t step = 0;   // the step every rank is at
  int64_t epoch = 0;  // 0-based
  int64_t total_steps = 0;
  int64_t batches_per_epoch = 0;  // per rank, on this generation's partition
  const Parallel* parallel = nullptr;
  std::string change = "";  // "lost node H (ID); joined node H (ID)", "" when none
  bool after_failure = false;
  int64_t thrown_away = 0;  // worker-steps lost to the change (elastic)
  // How the state was agreed: "resumed from DIR/step_N (...)", "2 rank(s) received the state
  // from rank 0 (N bytes)", "every rank had the state", "started fresh".
  std::string agreement = "";
  std::string resumed_from = "";  // a checkpoint's path when the state came from disk
  bool resized = false;           // that checkpoint was written by another number of ranks
  int64_t state_bytes = 0;        // sent to the ranks behind
  double agreement_ms = 0;
  uint64_t replica_hash = 0;
};

struct StepEvent {
  bool lead = false;
  int64_t step = 0;   // steps done, this one included
  int64_t epoch = 0;  // 0-based
  double loss = 0;    // this rank's
  double lr = 0;      // the first param group's lr this step used
  int world_size = 1;
  int64_t generation = 0;
};

// A checkpoint handed to the writer (written in the background; checkpoint::Checkpointer).
struct CheckpointEvent {
  bool lead = false;
  int64_t step = 0;
  std::string path;          // DIR/step_<step>
  double stall_seconds = 0;  // this rank's training thread, in the save: the snapshot, waiting
                             // for the previous write, and (elastic, preemption between world
                             // averagings) averaging the replicas first
  bool preemption = false;   // written on SIGUSR1/SIGTERM
};

struct EvalEvent {
  bool lead = false;
  int64_t step = 0;
  int64_t epoch = 0;
  bool epoch_end = false;
  EvalResult result{};
};

struct EpochEvent {
  bool lead = false;
  int64_t epoch = 0;  // 0-based, the epoch that ended
  int64_t step = 0;
  int64_t steps = 0;                          // steps of this epoch on this rank
  double train_loss = 0, train_accuracy = 0;  // over every rank's examples of the epoch
  double seconds = 0;                         // wall time of the epoch on this rank
  double images_per_second = 0;               // the job's training throughput (step time only)
  EvalResult eval{};
  int world_size = 1;
};

class RunListener {
 public:
  virtual ~RunListener() = default;
  virtual void on_generation(const GenerationEvent&) {}
  virtual void on_step(const StepEvent&) {}
  // The training clock stops between on_eval_begin and on_eval_end (after a barrier of all
  // ranks, so that no rank trains while another evaluates).
  virtual void on_eval_begin() {}
  virtual void on_eval(const EvalEvent&) {}
  virtual void on_eval_end() {}
  virtual void on_epoch(const EpochEvent&) {}
  virtual void on_checkpoint(const CheckpointEvent&) {}
};

}  // namespace hsgd::runtime
