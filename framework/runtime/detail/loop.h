#pragma once
// The Runtime's loop (runtime.h): one object per run() call. runtime.cpp holds the step loop,
// generation.cpp what happens when a generation is entered and left (the state agreement, the
// top level's carried state, the checkpoints of the generation).

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/elastic/elastic_world.h"
#include "comm/process_group/process_group.h"
#include "framework/checkpoint/checkpointer.h"
#include "framework/data/data_loader.h"
#include "framework/runtime/parallel.h"
#include "framework/runtime/preemption.h"
#include "framework/runtime/run_listener.h"
#include "framework/runtime/runtime.h"
#include "framework/runtime/training_state.h"

namespace hsgd::runtime::detail {

using Clock = std::chrono::steady_clock;

// This rank's training state at its last consistent point: the registered objects (live) plus
// what the loop counts.
struct Replica {
  bool has_state = false;  // false on a joining node until a peer (or a checkpoint) gave it
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t total_steps = 0;
  StateDict loader;  // the data position at `step`; empty: the start of `epoch`
  // This epoch's sums on this rank (for the epoch's event).
  double loss_sum = 0, correct = 0, step_seconds = 0;
  int64_t images = 0, steps = 0;
  bool accuracy_known = false;
};

// The top level's settled state (outer anchor and momentum, this rank's residual) with what it
// belongs to, so that a generation whose top level differs starts it afresh.
struct TopLevelCarry {
  std::string level;  // carry_key() of the averager's last level; empty: nothing
  StateDict state;
};

// Why the loop leaves a generation.
enum class Leave { kFinished, kPreempted, kFailed, kJoin };

struct Registered {
  std::shared_ptr<nn::Module> model;
  std::vector<Tensor> average_buffers;
  std::shared_ptr<Optimizer> optimizer;
  SchedulerFactory make_scheduler;
};

class Loop {
 public:
  Loop(const RuntimeOptions& options, TrainingState& state, Registered registered,
       std::shared_ptr<const data::Dataset> train, const StepFn& step, RunListener* listener);
  ~Loop();
  RunResult run();

 private:
  // ---- runtime.cpp: the steps ----
  Leave train_generation();
  void step(const data::Batch& batch);
  void end_epoch();
  EvalResult evaluate_average(bool keep, bool epoch_end);
  bool at_world_boundary() const;
  bool overlapped_world_start() const;
  // A fragmented (streaming) world level started a period in the last step. Its fragments are
  // never all averaged at one step, so the replicas are never equal there: a join or an elastic
  // checkpoint at such a step makes them equal first (average_replicas_now).
  bool streaming_world_period_start() const;
  // Collective over the world: merges the averagings in flight, then sets every replica's
  // parameters and averaged buffers to their mean over the world.
  void average_replicas_now();
  // A checkpoint when one is due after this step (elastic: at a world boundary).
  void maybe_checkpoint(bool end_of_epoch);
  void save_checkpoint(bool preemption = false);

  // ---- generation.cpp: entering and leaving a generation ----
  void enter_generation(bool after_failure);
  // Hands the model at step 0 to the averager (ModelAverager::start_from); no-op later.
  void start_averager_from_model();
  // The state agreement of an elastic generation (see state_agreement.h); fills event.
  void agree_on_state(bool after_failure, GenerationEvent& event);
  // Loads the newest complete checkpoint into every rank (collective); false when there is none.
  bool load_checkpoint(GenerationEvent& event);
  void carry_top_level(int source);
  void make_loader();
  void make_scheduler();
  void make_checkpointer();
  void leave_generation();
  int lost_worker_count() const;
  std::string generation_change() const;
  StateDict full_state() const;
  void load_full_state(const StateDict& state);
  StateDict runtime_counters() const;

  const RuntimeOptions& options_;
  TrainingState& state_;
  const Registered registered_;
  const std::shared_ptr<const data::Dataset> train_;
  const StepFn& step_fn_;
  RunListener* const listener_;
  RunListener silent_;
  const bool elastic_;

  std::optional<comm::elastic::ElasticWorld> elastic_world_;
  std::shared_ptr<comm::ProcessGroup> world_;
  bool lead_ = false;
  int64_t generations_ = 0;
  Replica replica_;
  Parallel parallel_;
  std::unique_ptr<data::DataLoader> loader_;
  std::optional<data::DataLoader::Iterator> batch_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<checkpoint::Checkpointer> checkpointer_;
  // Threads that finish the writes of failed generations' checkpointers (joined by ~Loop).
  std::vector<std::thread> retired_;
  std::unique_ptr<PreemptionCheck> preemption_;
  int64_t last_saved_ = -1;
  int64_t checkpoint_due_ = -1;  // elastic: the step a periodic checkpoint waits for a boundary
  bool preempted_ = false;
  std::string preempted_checkpoint_;
  EvalResult final_;
  comm::elastic::Generation previous_{.number = -1};
  bool in_step_ = false;
  bool resumed_from_disk_ = false;  // the loader state came from a checkpoint
  int agreement_source_ = 0;        // the rank whose state the last agreement took
  int64_t discarded_steps_ = 0;
  int64_t boundary_step_ = 0;
  int64_t overlapped_start_step_ = 0;
  TopLevelCarry top_carry_;
  std::string carried_;
  Clock::time_point epoch_start_ = Clock::now();
};

}  // namespace hsgd::runtime::detail
