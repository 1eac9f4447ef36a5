// Entering and leaving a generation (runtime.h): the world's parallel machinery, the state
// agreement of an elastic generation, resuming from checkpoints, the top level's carried state.

#include <algorithm>
#include <array>
#include <variant>

#include "comm/elastic/membership.h"
#include "comm/log.h"
#include "comm/process_group/work.h"
#include "comm/process_group/worker_progress.h"
#include "framework/checkpoint/checkpoint_file.h"
#include "framework/runtime/detail/loop.h"
#include "framework/runtime/detail/state_transfer.h"

namespace hsgd::runtime::detail {
namespace {

// Set (by rank 0) once a generation agreed on a state: from then on a joiner has none.
const std::string kTrainingStartedKey = comm::elastic::kElasticPrefix + "training-started";

// How long rank 0 of an elastic generation waits for the other ranks' reports of a checkpoint
// written: a generation's members are alive or gone within the heartbeat timeout.
constexpr comm::Duration kElasticCheckpointTimeout = std::chrono::seconds(60);

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

}  // namespace

StateDict Loop::runtime_counters() const {
  StateDict s;
  s.set("step", replica_.step);
  s.set("epoch", replica_.epoch);
  s.set("total_steps", replica_.total_steps);
  return s;
}

StateDict Loop::full_state() const {
  StateDict s = state_.state_dict();
  s.merge("loader.", replica_.loader);
  s.merge("runtime.", runtime_counters());
  return s;
}

void Loop::load_full_state(const StateDict& s) {
  const StateDict counters = s.with_prefix("runtime.");
  replica_.total_steps = counters.get_int("total_steps");
  if (!scheduler_ && replica_.total_steps > 0) make_scheduler();
  state_.load_state_dict(s);
  replica_.loader = s.with_prefix("loader.");
  replica_.step = counters.get_int("step");
  replica_.epoch = counters.get_int("epoch");
  replica_.has_state = true;
  replica_.loss_sum = replica_.correct = replica_.step_seconds = 0;
  replica_.images = replica_.steps = 0;
}

void Loop::make_scheduler() {
  if (!registered_.make_scheduler || scheduler_) return;
  scheduler_ = registered_.make_scheduler(*registered_.optimizer, replica_.total_steps);
  if (!scheduler_) return;
  Scheduler* scheduler = scheduler_.get();
  state_.add(
      "scheduler", [scheduler] { return scheduler->state_dict(); },
      [scheduler](const StateDict& state) { scheduler->load_state_dict(state); });
}

void Loop::make_loader() {
  data::DataLoaderOptions loader_options = options_.loader;
  loader_options.rank = world_->rank();
  loader_options.world_size = world_->size();
  loader_ = std::make_unique<data::DataLoader>(train_, loader_options);
  if (replica_.loader.size() > 0) {
    loader_->load_state_dict(replica_.loader);
    if (resumed_from_disk_ && loader_->position() >= loader_->num_batches()) {
      // A checkpoint of an epoch's last step continues at the next epoch's start.
      ++replica_.epoch;
      replica_.loader = StateDict{};
      loader_->set_epoch(replica_.epoch);
    }
  } else {
    loader_->set_epoch(replica_.epoch);
  }
  resumed_from_disk_ = false;
  if (replica_.total_steps == 0) {
    HSGD_CHECK_AS(NoFullBatch, loader_->num_batches() > 0, "Runtime: loader.batch_size ",
                  loader_options.batch_size,
                  " leaves no full batch per rank: the training set has ", train_->size(),
                  " examples for ", world_->size(), " ranks");
    replica_.total_steps = options_.epochs * loader_->num_batches();
    if (options_.max_steps > 0) {
      replica_.total_steps = std::min(replica_.total_steps, options_.max_steps);
    }
  }
}

void Loop::make_checkpointer() {
  checkpointer_.reset();
  if (options_.checkpoint.dir.empty()) return;
  checkpointer_ = std::make_unique<checkpoint::Checkpointer>(
      checkpoint::CheckpointOptions{.dir = options_.checkpoint.dir,
                                    .keep_last = options_.checkpoint.keep_last,
                                    .timeout = kElasticCheckpointTimeout},
      world_,
      checkpoint::RunInfo{.mode = mode_name(options_.parallel.mode),
                          .hierarchy = options_.hierarchy_text,
                          .model = options_.model_name,
                          // Elastic: the nodes of a generation may run different numbers.
                          .local_world_size = elastic_ ? 1 : 0});
  checkpoint::Checkpointer& c = *checkpointer_;
  state_.register_with(c);
  c.add("loader", *loader_);
  c.add(
      "runtime", [this] { return runtime_counters(); },
      [this](const StateDict& s) {
        // A fixed-size job plans its length from its options (a resumed run may be given more
        // epochs); an elastic job keeps the length planned in its first generation.
        if (elastic_) replica_.total_steps = s.get_int("total_steps");
      });
  if (parallel_.averager) c.add("averager", parallel_.averager);
  if (parallel_.hook_state) c.add("post_local_hook", parallel_.hook_state);
}

void Loop::start_averager_from_model() {
  // At step 0 every rank holds rank 0's model (DDP's start): compressed levels anchor on it, so
  // their first averaging is compressed too (ModelAverager::start_from).
  if (parallel_.averager && replica_.step == 0) {
    parallel_.averager->start_from(registered_.model->parameters());
  }
}

void Loop::enter_generation(bool after_failure) {
  GenerationEvent event{
      .lead = lead_,
      .elastic = elastic_,
      .number = elastic_ ? elastic_world_->generation().number : 0,
      .nodes = elastic_ ? static_cast<int>(elastic_world_->generation().nodes.size()) : 1,
      .world_size = world_->size()};
  const auto start = Clock::now();
  if (elastic_) {
    agree_on_state(after_failure, event);
    parallel_ =
        make_parallel(registered_.model, world_, options_.parallel, registered_.average_buffers);
    if (parallel_.hook_state) parallel_.hook_state->iter = replica_.step;
    if (parallel_.averager) {
      parallel_.averager->set_step(replica_.step);
      carry_top_level(agreement_source_);
      event.agreement += carried_;
      start_averager_from_model();
    }
    make_loader();
    make_scheduler();
    make_checkpointer();
    last_saved_ = std::max(last_saved_, replica_.step);
  } else {
    parallel_ =
        make_parallel(registered_.model, world_, options_.parallel, registered_.average_buffers);
    make_loader();
    make_scheduler();
    make_checkpointer();
    std::optional<checkpoint::LoadedCheckpoint> loaded;
    if (checkpointer_ && options_.checkpoint.resume != "never") {
      loaded = checkpointer_->load(options_.checkpoint.resume);
    }
    if (loaded) {
      replica_.step = last_saved_ = loaded->step;
      replica_.epoch = loader_->epoch();
      if (loader_->position() >= loader_->num_batches()) {
        ++replica_.epoch;
        if (replica_.epoch < options_.epochs) loader_->set_epoch(replica_.epoch);
      } else {
        loader_->set_epoch(replica_.epoch);
      }
      event.resumed_from = loaded->path;
      event.resized = loaded->resized;
      event.agreement = "resumed from " + loaded->path;
    } else {
      event.agreement = "started fresh";
      start_averager_from_model();
    }
    replica_.has_state = true;
    // hsgd-run counts the steps lost to restarts from the step each attempt starts at.
    comm::report_progress(replica_.step);
  }
  preemption_ =
      std::make_unique<PreemptionCheck>(world_, checkpointer_ != nullptr, options_.preemption_lag);
  event.step = replica_.step;
  event.epoch = replica_.epoch;
  event.total_steps = replica_.total_steps;
  event.batches_per_epoch = loader_->num_batches();
  event.parallel = &parallel_;
  event.agreement_ms = ms_since(start);
  if (elastic_) event.replica_hash = model_hash(*registered_.model);
  listener_->on_generation(event);
  if (elastic_) previous_ = elastic_world_->generation();
}

bool Loop::load_checkpoint(GenerationEvent& event) {
  if (options_.checkpoint.dir.empty() || options_.checkpoint.resume == "never") return false;
  // The registered objects and the runtime's counters; the data position goes to the loader
  // made after the agreement, the averager and the hook take the step.
  checkpoint::Checkpointer reader(
      checkpoint::CheckpointOptions{.dir = options_.checkpoint.dir,
                                    .keep_last = options_.checkpoint.keep_last},
      world_,
      checkpoint::RunInfo{.mode = mode_name(options_.parallel.mode),
                          .hierarchy = options_.hierarchy_text,
                          .model = options_.model_name,
                          .local_world_size = 1});
  StateDict counters, loader;
  reader.add(
      "runtime", [this] { return runtime_counters(); },
      [&counters](const StateDict& s) { counters = s; });
  reader.add(
      "loader", [] { return StateDict{}; }, [&loader](const StateDict& s) { loader = s; });
  // The scheduler needs the run's length before it can take its state.
  StateDict scheduler_state;
  const bool had_scheduler = scheduler_ != nullptr;
  if (registered_.make_scheduler && !had_scheduler) {
    reader.add(
        "scheduler", [] { return StateDict{}; },
        [&scheduler_state](const StateDict& s) { scheduler_state = s; });
  }
  state_.register_with(reader);
  const std::optional<checkpoint::LoadedCheckpoint> loaded =
      reader.load(options_.checkpoint.resume);
  if (!loaded) return false;
  replica_.total_steps = counters.get_int("total_steps");
  if (!had_scheduler) {
    make_scheduler();
    if (scheduler_ && scheduler_state.size() > 0) scheduler_->load_state_dict(scheduler_state);
  }
  replica_.step = loaded->step;
  replica_.epoch = counters.get_int("epoch");
  replica_.loader = loader;
  resumed_from_disk_ = true;
  replica_.has_state = true;
  event.resumed_from = loaded->path;
  event.resized = loaded->resized;
  return true;
}

void Loop::agree_on_state(bool after_failure, GenerationEvent& event) {
  comm::ProcessGroup& world = *world_;
  const int64_t g = elastic_world_->generation().number;
  const bool started = elastic_world_->store().check({kTrainingStartedKey});
  // Until some generation agreed on a state, the job has not trained here: every member's
  // initial model is the state (rank 0's is sent to the others), unless a checkpoint holds one.
  const bool fresh = !replica_.has_state && !started;
  // Each rank's step (-1: no live state), whether it left its last generation on a failure, how
  // many steps it began and discarded since it last said so, and whether it is fresh.
  const int64_t mine = replica_.has_state ? replica_.step : -1;
  const std::array<int64_t, 4> said{mine, after_failure ? 1 : 0, discarded_steps_, fresh ? 1 : 0};
  discarded_steps_ = 0;
  std::vector<int64_t> gathered(said.size() * static_cast<size_t>(world.size()));
  world.allgather(std::span<const int64_t>(said), std::span<int64_t>(gathered), "elastic steps")
      ->wait();
  std::vector<int64_t> steps;
  bool any_failure = false;
  bool all_fresh = true;
  int64_t discarded = 0;
  for (size_t r = 0; r < static_cast<size_t>(world.size()); ++r) {
    steps.push_back(gathered[4 * r]);
    any_failure = any_failure || gathered[4 * r + 1] != 0;
    discarded += gathered[4 * r + 2];
    all_fresh = all_fresh && gathered[4 * r + 3] != 0;
  }
  int64_t top = *std::max_element(steps.begin(), steps.end());
  bool from_disk = false;
  if (top < 0 || all_fresh) {
    // No live replica: the newest complete checkpoint, else (never trained) a fresh start.
    from_disk = load_checkpoint(event);
    if (!from_disk && top < 0 && !all_fresh) {
      throw TrainingStateLost(str_cat(
          "elastic generation ", g, " (", elastic_world_->generation().describe(),
          "): no member holds the training state; every node that trained is gone",
          options_.checkpoint.dir.empty()
              ? ", and the run writes no checkpoints (give it a checkpoint directory to resume "
                "from disk)"
              : str_cat(", and ", options_.checkpoint.dir, " holds no complete checkpoint")));
    }
    if (!from_disk) replica_.has_state = true;  // fresh: the initial model
    for (int64_t& s : steps) s = replica_.step;
    top = replica_.step;
  }
  // F: the ranks at the top step; the lowest of them is the source.
  int source = -1, at_top = 0;
  for (int r = 0; r < world.size(); ++r) {
    if (steps[static_cast<size_t>(r)] != top) continue;
    if (source < 0) source = r;
    ++at_top;
  }
  // A fresh start sends rank 0's initial model to all: the programs' seeds may differ.
  if (all_fresh && !from_disk) at_top = 1;
  std::vector<std::string> configs;
  const std::string config =
      str_cat(model_signature(*registered_.model), "; mode ", mode_name(options_.parallel.mode),
              ", hierarchy '", options_.hierarchy_text, "'",
              options_.parallel.emulated_node_size > 0
                  ? str_cat(", emulated nodes of ", options_.parallel.emulated_node_size)
                  : std::string(),
              "; ", options_.configuration);
  world.allgather_bytes(config, configs, "elastic configuration")->wait();
  std::vector<int> differing;
  for (int r = 0; r < world.size(); ++r) {
    if (configs[static_cast<size_t>(r)] != configs[static_cast<size_t>(source)]) {
      differing.push_back(r);
    }
  }
  if (!differing.empty()) {
    if (config != configs[static_cast<size_t>(source)]) {
      throw ConfigurationMismatch(str_cat(
          "this node cannot join elastic generation ", g, ": its configuration\n  ", config,
          "\ndiffers from the job's (rank ", source, ")\n  ", configs[static_cast<size_t>(source)],
          "\nstart it with the same program and options as the other nodes"));
    }
    std::string ranks;
    for (int r : differing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    HSGD_THROW(CommError, "elastic generation ", g, ": rank(s) ", ranks,
               " joined with another configuration (", configs[static_cast<size_t>(differing[0])],
               "); they leave the job");
  }
  const bool in_f = steps[static_cast<size_t>(world.rank())] == top &&
                    (!all_fresh || from_disk || world.rank() == source);
  // Survivors of a failure (and ranks that loaded a checkpoint written by another layout)
  // average: the top-level averaging the lost node interrupted, applied by every one, never half.
  if ((any_failure || from_disk) && options_.parallel.mode != Mode::kDDP && at_top > 1) {
    std::vector<Tensor> tensors = registered_.model->parameters();
    tensors.insert(tensors.end(), registered_.average_buffers.begin(),
                   registered_.average_buffers.end());
    average_over(world, std::move(tensors), in_f, at_top);
  }
  int64_t state_bytes = 0;
  if (at_top < world.size()) {
    const StateDict state =
        broadcast_state(world, source, replica_.step, in_f ? full_state() : StateDict{},
                        "the elastic state", &state_bytes);
    if (!in_f) load_full_state(state);
  }
  const uint64_t hash = model_hash(*registered_.model);
  const auto mine_hash = static_cast<int64_t>(hash);
  std::vector<int64_t> hashes(static_cast<size_t>(world.size()));
  world
      .allgather(std::span<const int64_t>(&mine_hash, 1), std::span<int64_t>(hashes),
                 "elastic replica hashes")
      ->wait();
  for (int r = 0; r < world.size(); ++r) {
    HSGD_CHECK(hashes[static_cast<size_t>(r)] == mine_hash, "elastic generation ", g,
               ": the replicas differ after the state agreement (rank ", world.rank(), " hash ",
               hash, ", rank ", r, " hash ", static_cast<uint64_t>(hashes[static_cast<size_t>(r)]),
               ")");
  }
  // Work thrown away by this change: the steps the survivors discarded, and the local steps of
  // the lost workers since the last step at which every replica was the same (estimated with
  // the survivors' newest step: a lost worker was at most one step apart).
  const int64_t thrown_away =
      discarded + lost_worker_count() * std::max<int64_t>(0, top - boundary_step_);
  boundary_step_ = overlapped_start_step_ = replica_.step;
  if (world.rank() == 0) {
    elastic_world_->store().set(kTrainingStartedKey, comm::to_bytes("1"));
    if (thrown_away > 0) {
      elastic_world_->store().add(comm::elastic::kStepsThrownAwayKey, thrown_away);
    }
  }
  comm::report_progress(replica_.step);
  event.change = generation_change();
  event.after_failure = any_failure;
  event.thrown_away = thrown_away;
  event.state_bytes = state_bytes;
  agreement_source_ = source;
  if (from_disk) {
    event.agreement = "resumed from " + event.resumed_from;
  } else if (all_fresh) {
    event.agreement = "started fresh";
  } else if (at_top < world.size()) {
    event.agreement = str_cat(world.size() - at_top, " rank(s) received the state from rank ",
                              source, " (", state_bytes, " bytes)");
  } else {
    event.agreement = "every rank had the state";
  }
}

}  // namespace hsgd::runtime::detail
