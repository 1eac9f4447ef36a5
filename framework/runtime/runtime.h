#pragma once
// Runtime: the training runtime of a data-parallel program. The program registers its state once
// (model, optimizer, LR scheduler, generators, counters of its own) and hands over a step
// function; the Runtime forms the world, builds DDP, the post-local SGD hook and the averagers
// (ParallelOptions), iterates the data, steps the optimizer, the averagers and the scheduler,
// writes periodic and preemption checkpoints and resumes from them. Under hsgd-run --nnodes
// MIN:MAX (elastic) it does all of that in every generation of the job: a lost node does not
// stop the others, a joining node takes the whole state from a live peer, and with a checkpoint
// directory a job that lost every node resumes from disk. A fixed-size job is one generation.
//
// Usage (the README's program, elastic and durable):
//   runtime::Runtime rt({.parallel = {.mode = runtime::Mode::kHierarchical,
//                                     .levels = distributed::parse_hierarchy("2:node,16:world"),
//                                     .warmup_steps = 100},
//                        .loader = {.batch_size = 64, .shuffle = true},
//                        .checkpoint = {.dir = "ckpt", .every = 200}});
//   rt.register_model(model);
//   rt.register_optimizer(std::make_shared<optim::AdamW>(model->parameters(),
//                                                        optim::AdamWOptions{.lr = 1e-3}));
//   rt.run(dataset, [&](runtime::StepContext& step, const data::Batch& batch) {
//     Tensor loss = nn::cross_entropy(step.forward(batch.inputs), batch.targets);
//     loss.backward();
//     nn::utils::clip_grad_norm_(model->parameters(), 1.0);
//     return loss;
//   });
//
// One step: optimizer.zero_grad(); the step function (forward through step.forward, loss,
// backward, whatever comes before the optimizer step); optimizer.step(); the scheduler's step;
// the step is counted; the averager averages (outside kDDP); a checkpoint when due. A step whose
// gradient allreduce failed is recomputed in the next generation from the same data position; a
// failure in the averaging after the optimizer step counts the step and lets the next
// generation's state agreement replace the averaging.
//
// Generations (elastic; framework/runtime/generation.cpp holds the agreement itself):
//   - entering one, the members agree on the state: survivors of a failure average their
//     replicas, the most advanced replica is sent to every rank behind it (joiners), every rank
//     checks a hash of the parameters; a job in which no member holds a live state loads the
//     newest complete checkpoint (or starts fresh when it never trained);
//   - a join is adopted at the next step where every replica is the same (the ranks vote);
//   - a failure (a collective throws hsgd::CommError) abandons the generation at once.
// In a fixed-size job a CommError propagates (hsgd-run restarts the job from its checkpoints).
//
// Checkpoints (CheckpointOptions.dir set): every `every` steps (0: at each epoch end) and on
// SIGUSR1/SIGTERM (install_preemption_signals), through checkpoint::Checkpointer, in the
// background. In an elastic job a periodic checkpoint is written at the first step at or after
// the due step where every replica is the same (so that it resumes on any number of nodes); each
// generation has its own writers. A preemption checkpoint stops the run: run() returns with
// RunResult::preempted, and the program exits comm::launcher::kExitPreempted (75).
//
// Errors: bad options throw hsgd::InvalidArgument naming the field and value; a node whose
// configuration differs from the job's throws ConfigurationMismatch; a job that lost every
// replica with no checkpoint to resume from throws TrainingStateLost.
// Not thread-safe: one thread registers and runs.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/error.h"
#include "comm/process_group/process_group.h"
#include "framework/checkpoint/checkpointer.h"
#include "framework/data/data_loader.h"
#include "framework/data/dataset.h"
#include "framework/nn/module.h"
#include "framework/runtime/parallel.h"
#include "framework/runtime/run_listener.h"
#include "framework/runtime/training_state.h"
#include "framework/train/optimizer.h"

namespace hsgd::runtime {

namespace detail {
class Loop;
}

struct CheckpointOptions {
  std::string dir = "";  // empty: no checkpoints (preemption signals then end the process)
  int64_t every = 0;     // steps between checkpoints; 0: at the end of every epoch
  // "auto": the newest complete checkpoint in dir if there is one; "never": start fresh; or the
  // path of one checkpoint (dir/step_N).
  std::string resume = "auto";
  int keep_last = 2;  // complete checkpoints kept (>= 1)
};

struct RuntimeOptions {
  ParallelOptions parallel{};
  // The world of a fixed-size job; null: init_process_group(InitOptions::from_env()) (the ranks
  // hsgd-run gives). Under an elastic hsgd-run the generations make the worlds (set: refused).
  std::shared_ptr<comm::ProcessGroup> world = nullptr;
  // rank and world_size are set per generation.
  data::DataLoaderOptions loader{};
  int64_t epochs = 1;     // >= 1
  int64_t max_steps = 0;  // 0: epochs x batches per rank (of the first generation)
  CheckpointOptions checkpoint{};
  // Recorded in checkpoint manifests and compared on resume: the model's name ("resnet20") and
  // the hierarchy's text (in distributed::format_hierarchy's canonical form when it parses).
  std::string model_name = "";
  std::string hierarchy_text = "";
  // What else every member of a job must share, beyond the model's tensors and the parallel
  // options (e.g. "AdamW lr 0.001, batch 64"): a joining node whose text differs is refused.
  std::string configuration = "";
  // Evaluates the average of the replicas at each epoch end (and every eval_every steps within
  // an epoch): each rank evaluates a shard; null: no evaluation.
  EvalFn evaluate = nullptr;
  int64_t eval_every = 0;
  bool allow_nonfinite_loss = false;  // else a NaN/inf loss stops the run
  // Steps between the preemption flag and the stop it decides (PreemptionCheck's lag).
  int preemption_lag = 4;
};

// What a step function sees.
class StepContext {
 public:
  // model.forward(x), through DDP when the run has it (gradients are then allreduced in backward).
  Tensor forward(const Tensor& x) const;
  // The same for a model whose input is ids (a language model's batch.input_ids).
  Tensor forward(const IndexTensor& ids) const;
  int64_t step() const { return step_; }    // steps done before this one
  int64_t epoch() const { return epoch_; }  // 0-based
  comm::ProcessGroup& world() const { return *world_; }
  // The data set indices of the batch's examples, in batch order.
  std::span<const int64_t> indices() const { return indices_; }
  // The batch's training accuracy (a fraction), for the epoch's train_accuracy.
  void record_accuracy(double accuracy) { accuracy_ = accuracy; }

 private:
  friend class detail::Loop;
  StepContext(const Parallel& parallel, nn::Module& model, comm::ProcessGroup& world, int64_t step,
              int64_t epoch, std::span<const int64_t> indices)
      : parallel_(parallel),
        model_(model),
        world_(&world),
        step_(step),
        epoch_(epoch),
        indices_(indices) {}
  const Parallel& parallel_;
  nn::Module& model_;
  comm::ProcessGroup* world_;
  int64_t step_, epoch_;
  std::span<const int64_t> indices_;
  std::optional<double> accuracy_;
};

// Computes the gradients of one batch (forward through step.forward, loss, backward, clipping)
// and returns the loss (a scalar; its value is reported).
using StepFn = std::function<Tensor(StepContext& step, const data::Batch& batch)>;

// How run() ended.
struct RunResult {
  int64_t step = 0;  // steps trained in all (resumed ones included)
  bool preempted = false;
  std::string checkpoint = "";  // preempted: the checkpoint written (dir/step_N)
  int preemption_signal = 0;    // the signal this rank received (0: another rank's)
  int64_t total_steps = 0;      // the steps the run was planned for
  EvalResult final_eval{};      // the last evaluation (of the average, kept on every rank)
  int64_t generations = 1;      // generations entered (1 in a fixed-size job)
  int world_size = 0;           // at the end
  int rank = 0;                 // this process's rank at the end
  // The averager's level_stats() at the end (empty in kDDP).
  std::vector<distributed::AveragingLevelStats> averaging{};
  uint64_t replica_hash = 0;  // of the parameters at the end, equal on every rank
};

// A node that cannot join: its configuration differs from the job's. Leaves for good.
class ConfigurationMismatch : public Error {
 public:
  using Error::Error;
};

// The loader's batch size leaves an epoch without a full batch on this rank.
class NoFullBatch : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// No member of a generation holds a training state and no checkpoint holds one either.
class TrainingStateLost : public Error {
 public:
  using Error::Error;
};

class Runtime {
 public:
  // Throws InvalidArgument for bad options (see RuntimeOptions).
  explicit Runtime(const RuntimeOptions& options);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // ---- registration (before run) ----
  // The model; average_buffers (BatchNorm statistics) are averaged with the parameters.
  void register_model(std::shared_ptr<nn::Module> model, std::vector<Tensor> average_buffers = {});
  // Over the model's parameters, not wrapped in PostLocalSGDOptimizer: the Runtime averages.
  void register_optimizer(std::shared_ptr<Optimizer> optimizer);
  // Made once the run knows its total steps (before the first step, or on a joiner when it
  // receives the state), stepped after every optimizer step.
  void register_scheduler(SchedulerFactory make);
  // Anything else with a state: counters of the program's own, generators (TrainingState).
  TrainingState& state() { return state_; }
  // Whether this process runs under an elastic hsgd-run (HSGD_ELASTIC_NODE_ID is set).
  static bool elastic_in_env();

  // Trains until the epochs (or max_steps) are done or a preemption stops the run; collective
  // over the job. The world is RuntimeOptions::world (or the environment's) in a fixed-size job,
  // and the job's generations under an elastic hsgd-run. The world is shut down at the end.
  // listener (may be null) hears the events.
  RunResult run(std::shared_ptr<const data::Dataset> train, const StepFn& step,
                RunListener* listener = nullptr);

 private:
  const RuntimeOptions options_;
  std::shared_ptr<nn::Module> model_;
  std::vector<Tensor> average_buffers_;
  std::shared_ptr<Optimizer> optimizer_;
  SchedulerFactory make_scheduler_;
  TrainingState state_;
};

}  // namespace hsgd::runtime
