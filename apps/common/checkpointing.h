#pragma once
// Durable runs for the bundled examples: the --checkpoint-dir / --checkpoint-every / --resume
// flags and the Checkpointer (framework/checkpoint/) wired to what the examples train.
//
// Usage:
//   CLI::App app{"train_mlp"};
//   apps::CheckpointFlags checkpoint_flags;
//   apps::add_checkpoint_flags(app, checkpoint_flags);
//   // ... parse, build the model, optimizer and loader ...
//   apps::RunCheckpoints checkpoints(checkpoint_flags, world, {.mode = "ddp", .model = "mlp"},
//                                    {.model = model, .optimizer = optimizer, .loader = &loader});
//   int64_t step = checkpoints.resume();      // 0, or the step of the checkpoint resumed from
//   const bool end_of_epoch = false;
//   checkpoints.after_step(++step, end_of_epoch);   // after each optimizer step
//   checkpoints.finish();                     // the last write is on disk
//
// With --resume auto (the default) a run whose --checkpoint-dir holds a complete checkpoint
// continues from it and rank 0 prints one line: "resumed from DIR/step_N (epoch E, step S)".
// Under hsgd-run --max-restarts a restarted attempt therefore continues without extra flags.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "apps/common/parallel_training.h"
#include "comm/process_group/process_group.h"
#include "framework/checkpoint/checkpointer.h"
#include "framework/data/data_loader.h"
#include "framework/nn/module.h"
#include "framework/train/optimizer.h"
#include "optim/lr_scheduler.h"

namespace hsgd::apps {

struct CheckpointFlags {
  std::string dir = "";         // empty: no checkpoints
  int64_t every = 0;            // steps between checkpoints; 0: at the end of every epoch
  std::string resume = "auto";  // auto | never | the path of one checkpoint (DIR/step_N)
  int keep_last = 2;
};

// Adds the flags, and checks them as soon as the command line is parsed (app's
// parse_complete_callback, so before any data loads) with check_checkpoint_flags.
void add_checkpoint_flags(CLI::App& app, CheckpointFlags& flags);

// Throws CLI::ValidationError (a usage error: exit 2) when --resume names a path that is not one
// complete checkpoint: without --checkpoint-dir, not a directory, a directory of checkpoints
// (naming the newest complete one), or a directory without a manifest.
void check_checkpoint_flags(const CheckpointFlags& flags);

// What a bundled example resumes. Pointers may be null where the run has no such object.
struct Resumable {
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<Optimizer> optimizer;  // the wrapped one (PostLocalSGDOptimizer carries the
                                         // averager's step)
  optim::LRScheduler* scheduler = nullptr;
  data::DataLoader* loader = nullptr;
  const Parallel* parallel = nullptr;  // its averager and post-local hook state
  int64_t warmup_steps = 0;            // steps whose gradients are averaged over the world
};

class RunCheckpoints {
 public:
  // Does nothing (every call returns at once) when flags.dir is empty. Bad flag values throw
  // BadFlag; an unusable directory throws checkpoint::CheckpointError naming it.
  RunCheckpoints(const CheckpointFlags& flags, std::shared_ptr<comm::ProcessGroup> world,
                 checkpoint::RunInfo run, Resumable objects);

  // Loads per --resume (collective); returns the number of steps already trained (0 when the
  // run starts fresh). Rank 0 prints the "resumed from" line.
  int64_t resume();
  // Call after the optimizer step that brought the run to `step` steps; saves when --checkpoint-
  // every divides step, or (every == 0) when end_of_epoch.
  void after_step(int64_t step, bool end_of_epoch);
  // Saves `step` now unless it is already saved (collective), e.g. when the run is preempted.
  void save_now(int64_t step);
  // Waits for the last write; rethrows its error.
  void finish();
  // Whether the run writes checkpoints (--checkpoint-dir given).
  bool enabled() const { return checkpointer_ != nullptr; }
  const std::string& dir() const { return flags_.dir; }

 private:
  bool replicas_equal(int64_t step) const;

  const CheckpointFlags flags_;
  const std::shared_ptr<comm::ProcessGroup> world_;
  const Resumable objects_;
  std::unique_ptr<checkpoint::Checkpointer> checkpointer_;
  int64_t last_saved_ = -1;
};

}  // namespace hsgd::apps
