#include "framework/runtime/runtime.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <source_location>
#include <span>

#include "comm/log.h"
#include "comm/process_group/work.h"
#include "comm/process_group/worker_progress.h"
#include "framework/checkpoint/checkpoint_file.h"
#include "framework/distributed/averaged_replicas.h"
#include "framework/runtime/detail/loop.h"
#include "framework/runtime/detail/state_transfer.h"
#include "framework/tensor/grad_mode.h"

namespace hsgd::runtime {

Tensor StepContext::forward(const Tensor& x) const { return parallel_.forward(model_, x); }
Tensor StepContext::forward(const IndexTensor& ids) const { return parallel_.forward(model_, ids); }

namespace {

// Manifests and joiners compare the hierarchy's text: two spellings of one hierarchy must match.
RuntimeOptions with_canonical_hierarchy(const RuntimeOptions& given) {
  RuntimeOptions options = given;
  if (options.hierarchy_text.empty()) return options;
  try {
    options.hierarchy_text =
        distributed::format_hierarchy(distributed::parse_hierarchy(options.hierarchy_text));
  } catch (const InvalidArgument&) {
    // Not in the grammar (a name of the program's own): compared as given.
  }
  return options;
}

}  // namespace

Runtime::Runtime(const RuntimeOptions& options) : options_(with_canonical_hierarchy(options)) {
  const std::string problem = check(options_.parallel);
  HSGD_CHECK_AS(InvalidArgument, problem.empty(), "Runtime: ", problem);
  HSGD_CHECK_AS(InvalidArgument, options_.epochs >= 1, "Runtime: epochs ", options_.epochs,
                " must be at least 1");
  HSGD_CHECK_AS(InvalidArgument, options_.max_steps >= 0, "Runtime: max_steps ", options_.max_steps,
                " must be at least 0 (0: no limit)");
  HSGD_CHECK_AS(InvalidArgument, options_.eval_every >= 0, "Runtime: eval_every ",
                options_.eval_every, " must be at least 0 (0: at epoch ends only)");
  HSGD_CHECK_AS(InvalidArgument, options_.checkpoint.every >= 0, "Runtime: checkpoint.every ",
                options_.checkpoint.every, " must be at least 0 (0: at the end of every epoch)");
  HSGD_CHECK_AS(InvalidArgument, options_.checkpoint.keep_last >= 1,
                "Runtime: checkpoint.keep_last ", options_.checkpoint.keep_last,
                " must be at least 1");
  HSGD_CHECK_AS(InvalidArgument,
                !options_.checkpoint.dir.empty() || options_.checkpoint.resume == "auto" ||
                    options_.checkpoint.resume == "never",
                "Runtime: checkpoint.resume '", options_.checkpoint.resume,
                "' needs checkpoint.dir");
}

Runtime::~Runtime() = default;

bool Runtime::elastic_in_env() { return comm::elastic::ElasticWorldOptions::enabled_in_env(); }

void Runtime::register_model(std::shared_ptr<nn::Module> model,
                             std::vector<Tensor> average_buffers) {
  HSGD_CHECK_AS(InvalidArgument, model != nullptr, "Runtime::register_model: model is null");
  model_ = model;
  average_buffers_ = std::move(average_buffers);
  state_.add_module("model", std::move(model));
}

void Runtime::register_optimizer(std::shared_ptr<Optimizer> optimizer) {
  HSGD_CHECK_AS(InvalidArgument, optimizer != nullptr,
                "Runtime::register_optimizer: optimizer is null");
  optimizer_ = optimizer;
  state_.add("optimizer", std::move(optimizer));
}

void Runtime::register_scheduler(SchedulerFactory make) { make_scheduler_ = std::move(make); }

RunResult Runtime::run(std::shared_ptr<const data::Dataset> train, const StepFn& step,
                       RunListener* listener) {
  HSGD_CHECK_AS(InvalidArgument, model_ != nullptr && optimizer_ != nullptr,
                "Runtime::run: register_model and register_optimizer first");
  HSGD_CHECK_AS(InvalidArgument, train != nullptr, "Runtime::run: the training set is null");
  HSGD_CHECK_AS(InvalidArgument, static_cast<bool>(step), "Runtime::run: no step function");
  HSGD_CHECK_AS(InvalidArgument, options_.world == nullptr || !elastic_in_env(),
                "Runtime::run: RuntimeOptions::world is set under an elastic hsgd-run, whose "
                "generations make the worlds");
  detail::Loop loop(options_, state_,
                    {.model = model_,
                     .average_buffers = average_buffers_,
                     .optimizer = optimizer_,
                     .make_scheduler = make_scheduler_},
                    std::move(train), step, listener);
  return loop.run();
}

namespace detail {

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

Loop::Loop(const RuntimeOptions& options, TrainingState& state, Registered registered,
           std::shared_ptr<const data::Dataset> train, const StepFn& step, RunListener* listener)
    : options_(options),
      state_(state),
      registered_(std::move(registered)),
      train_(std::move(train)),
      step_fn_(step),
      listener_(listener != nullptr ? listener : &silent_),
      elastic_(Runtime::elastic_in_env()) {}

Loop::~Loop() {
  for (std::thread& t : retired_) t.join();
}

RunResult Loop::run() {
  if (elastic_) elastic_world_.emplace(comm::elastic::ElasticWorldOptions::from_env());
  bool failed = false;
  Leave leave = Leave::kFailed;
  for (;;) {
    if (elastic_) {
      world_ = elastic_world_->advance();
    } else {
      world_ =
          options_.world ? options_.world : comm::init_process_group(comm::InitOptions::from_env());
    }
    lead_ = world_->rank() == 0;
    ++generations_;
    try {
      enter_generation(failed);
      leave = train_generation();
    } catch (const CommError& e) {
      if (!elastic_) throw;
      comm::logger()->warn("elastic generation {} (rank {} of {}) lost a member: {}",
                           elastic_world_->generation().number, world_->rank(), world_->size(),
                           e.what());
      leave = Leave::kFailed;
      // A step that failed is recomputed in the next generation (its batch is taken again).
      if (in_step_) ++discarded_steps_;
      in_step_ = false;
    }
    if (leave == Leave::kFinished || leave == Leave::kPreempted) break;
    failed = leave == Leave::kFailed;
    // After a failure nobody waits for the others to leave: the world may lack a member.
    if (failed) world_->abort();
    leave_generation();
  }
  if (checkpointer_) checkpointer_->wait();
  if (preemption_ && leave == Leave::kFinished) preemption_->finish();
  RunResult result{.step = replica_.step,
                   .preempted = leave == Leave::kPreempted,
                   .checkpoint = preempted_checkpoint_,
                   .preemption_signal = preemption_signal(),
                   .total_steps = replica_.total_steps,
                   .final_eval = final_,
                   .generations = generations_,
                   .world_size = world_->size(),
                   .rank = world_->rank(),
                   .averaging = parallel_.averager
                                    ? parallel_.averager->level_stats()
                                    : std::vector<distributed::AveragingLevelStats>{},
                   .replica_hash = model_hash(*registered_.model)};
  if (elastic_) {
    leave_generation();
  } else {
    // No rank leaves while a peer may still have a collective in flight.
    preemption_.reset();
    parallel_ = Parallel{};
    world_->shutdown();
  }
  return result;
}

bool Loop::at_world_boundary() const {
  if (world_->size() == 1) return true;
  if (options_.parallel.mode == Mode::kDDP) return true;
  if (replica_.step <= options_.parallel.warmup_steps) return true;
  return parallel_.averager && parallel_.averager->averaged_whole_group_last_step();
}

// An averaging of the whole world started in the last step and is in flight (overlap): the
// replicas are equal once it completes, which a join makes happen at once.
bool Loop::overlapped_world_start() const {
  return parallel_.averager && parallel_.averager->started_whole_group_averaging_last_step() &&
         parallel_.averager->has_pending();
}

bool Loop::streaming_world_period_start() const {
  return parallel_.averager && parallel_.averager->started_streaming_whole_group_period_last_step();
}

void Loop::average_replicas_now() {
  if (parallel_.averager) parallel_.averager->finish_pending(registered_.model->parameters());
  std::vector<Tensor> tensors = registered_.model->parameters();
  tensors.insert(tensors.end(), registered_.average_buffers.begin(),
                 registered_.average_buffers.end());
  distributed::AveragedReplicas(world_, std::move(tensors)).keep();
}

Leave Loop::train_generation() {
  comm::ProcessGroup& world = *world_;
  if (replica_.epoch >= options_.epochs || replica_.step >= replica_.total_steps) {
    // Resumed after the last step: nothing left to train; the average is what the run gives.
    evaluate_average(/*keep=*/true, /*epoch_end=*/true);
    return Leave::kFinished;
  }
  while (replica_.epoch < options_.epochs && replica_.step < replica_.total_steps) {
    if (!batch_) {
      epoch_start_ = Clock::now();
      batch_.emplace(loader_->begin());
    }
    if (*batch_ == loader_->end()) {
      end_epoch();
      continue;
    }
    in_step_ = true;
    step(**batch_);
    // Before the iterator moves on: the loader's position counts the batch just trained as the
    // last one handed out, which is what a checkpoint of this step must hold.
    const bool end_of_epoch = loader_->position() == loader_->num_batches();
    maybe_checkpoint(end_of_epoch);
    if (preemption_ && preemption_->stop_now()) {
      preempted_ = true;
      save_checkpoint(/*preemption=*/true);
      preempted_checkpoint_ = checkpoint::step_dir(checkpointer_->dir(), replica_.step);
      checkpointer_->wait();
      return Leave::kPreempted;
    }
    if (options_.eval_every > 0 && replica_.steps % options_.eval_every == 0 && !end_of_epoch &&
        replica_.step < replica_.total_steps) {
      evaluate_average(/*keep=*/false, /*epoch_end=*/false);
    }
    ++*batch_;
    if (!elastic_) continue;
    const bool overlapped = overlapped_world_start();
    const bool streaming = streaming_world_period_start();
    if (overlapped || streaming || at_world_boundary()) {
      // With overlap, the snapshot of the previous world averaging is merged into every replica
      // by now (a level merges before it starts again).
      boundary_step_ = overlapped ? overlapped_start_step_ : replica_.step;
      if (overlapped) overlapped_start_step_ = replica_.step;
      double newer = elastic_world_->newer_generation_announced() ? 1.0 : 0.0;
      world.allreduce(std::span<double>(&newer, 1), comm::ReduceOp::kMax, "elastic join vote")
          ->wait();
      if (newer > 0) {
        // No local step since the snapshot: completing the averaging now leaves every replica at
        // the group's result, the same as an averaging without overlap.
        if (overlapped) parallel_.averager->finish_pending(registered_.model->parameters());
        // A streaming world level: one averaging of the whole model makes the replicas equal.
        if (streaming && !at_world_boundary()) average_replicas_now();
        boundary_step_ = replica_.step;
        return Leave::kJoin;
      }
    }
  }
  // Stopped by max_steps inside an epoch: that epoch ends here.
  if (replica_.epoch < options_.epochs && batch_) end_epoch();
  return Leave::kFinished;
}

void Loop::step(const data::Batch& batch) {
  const auto start = Clock::now();
  Optimizer& optimizer = *registered_.optimizer;
  const double lr = optimizer.param_groups().front().lr.value_or(0.0);
  optimizer.zero_grad();
  const int64_t batch_size = batch.size();
  const std::span<const int64_t> all(loader_->indices());
  const size_t first =
      static_cast<size_t>((loader_->position() - 1) * loader_->options().batch_size);
  const std::span<const int64_t> indices = first + static_cast<size_t>(batch_size) <= all.size()
                                               ? all.subspan(first, static_cast<size_t>(batch_size))
                                               : std::span<const int64_t>();
  StepContext context(parallel_, *registered_.model, *world_, replica_.step, replica_.epoch,
                      indices);
  // A failed gradient allreduce throws here: nothing applied yet.
  const Tensor loss = step_fn_(context, batch);
  HSGD_CHECK_AS(InvalidArgument, loss.defined() && loss.numel() == 1,
                "Runtime: the step function must return the scalar loss, got ",
                loss.defined() ? shape_str(loss.shape()) : std::string("an undefined tensor"));
  optimizer.step();
  if (scheduler_ != nullptr) scheduler_->step();
  const double loss_value = loss.item();
  HSGD_CHECK(std::isfinite(loss_value) || options_.allow_nonfinite_loss, "the training loss is ",
             loss_value, " at step ", replica_.step + 1, " (epoch ", replica_.epoch + 1, ", rank ",
             world_->rank(), ", lr ", lr,
             "): training diverged; lower the learning rate, or allow a non-finite loss to "
             "continue anyway");
  const auto n = static_cast<double>(batch_size);
  replica_.loss_sum += loss_value * n;
  if (context.accuracy_) {
    replica_.correct += *context.accuracy_ * n;
    replica_.accuracy_known = true;
  }
  replica_.images += batch_size;
  ++replica_.step;
  ++replica_.steps;
  replica_.step_seconds += seconds_since(start);
  // The step is done: its data position goes with its count (a discarded step retakes its
  // batch). Saved before the averaging below, so that a failed averaging, which does not undo
  // the step, leaves the two consistent on every rank.
  if (elastic_) replica_.loader = loader_->state_dict();
  in_step_ = false;
  comm::report_progress(replica_.step);  // hsgd-run's hang detection and lost-step count
  listener_->on_step({.lead = lead_,
                      .step = replica_.step,
                      .epoch = replica_.epoch,
                      .loss = loss_value,
                      .lr = lr,
                      .world_size = world_->size(),
                      .generation = elastic_ ? elastic_world_->generation().number : 0});
  // The averaging comes after the step is counted: when it fails, the next generation's state
  // agreement replaces it.
  if (parallel_.averager) {
    parallel_.averager->average_parameters(registered_.model->parameters());
  }
}

void Loop::end_epoch() {
  std::vector<double> sums{replica_.loss_sum, replica_.correct,
                           static_cast<double>(replica_.images), replica_.step_seconds};
  if (world_->size() > 1) {
    world_->allreduce(std::span<double>(sums), comm::ReduceOp::kSum, "epoch sums")->wait();
  }
  const bool last = replica_.epoch + 1 >= options_.epochs || replica_.step >= replica_.total_steps;
  const EvalResult eval = evaluate_average(/*keep=*/last, /*epoch_end=*/true);
  const double denom = sums[2] > 0 ? sums[2] : 1.0;
  const double job_step_seconds = sums[3] / world_->size();
  listener_->on_epoch({.lead = lead_,
                       .epoch = replica_.epoch,
                       .step = replica_.step,
                       .steps = replica_.steps,
                       .train_loss = sums[0] / denom,
                       .train_accuracy = sums[1] / denom,
                       .seconds = seconds_since(epoch_start_),
                       .images_per_second = job_step_seconds > 0 ? sums[2] / job_step_seconds : 0,
                       .eval = eval,
                       .world_size = world_->size()});
  ++replica_.epoch;
  replica_.loss_sum = replica_.correct = replica_.step_seconds = 0;
  replica_.images = replica_.steps = 0;
  replica_.loader = StateDict{};
  batch_.reset();
  if (replica_.epoch < options_.epochs) loader_->set_epoch(replica_.epoch);
}

EvalResult Loop::evaluate_average(bool keep, bool epoch_end) {
  listener_->on_eval_begin();
  // An overlapped averaging still in flight is merged first when keeping.
  if (keep && parallel_.averager) {
    parallel_.averager->finish_pending(registered_.model->parameters());
  }
  EvalResult eval;
  {
    // Through the averager: a compressed top level sends the replicas' differences from its
    // anchor in its own format (docs/averaging.md, "The evaluated model").
    const std::source_location here = std::source_location::current();
    std::optional<distributed::AveragedReplicas> average;
    if (parallel_.averager) {
      average.emplace(world_, *registered_.model, *parallel_.averager, here);
    } else {
      average.emplace(world_, *registered_.model, here);
    }
    if (keep) average->keep();
    if (options_.evaluate) {
      // Every rank evaluates a shard: no rank waits in a collective while another evaluates.
      NoGradGuard no_grad;
      registered_.model->eval();
      const EvalSums mine = options_.evaluate(*registered_.model, world_->rank(), world_->size());
      registered_.model->train();
      std::vector<double> sums{mine.loss_sum, mine.correct, static_cast<double>(mine.examples)};
      if (world_->size() > 1) {
        world_->allreduce(std::span<double>(sums), comm::ReduceOp::kSum, "evaluation")->wait();
      }
      if (sums[2] > 0) eval = EvalResult{.loss = sums[0] / sums[2], .accuracy = sums[1] / sums[2]};
    }
  }
  final_ = eval;
  listener_->on_eval({.lead = lead_,
                      .step = replica_.step,
                      .epoch = replica_.epoch,
                      .epoch_end = epoch_end,
                      .result = eval});
  if (options_.eval_every > 0 && world_->size() > 1) world_->barrier()->wait();
  listener_->on_eval_end();
  return eval;
}

void Loop::maybe_checkpoint(bool end_of_epoch) {
  if (!checkpointer_ || replica_.step <= last_saved_) return;
  const int64_t every = options_.checkpoint.every;
  const bool due = every > 0 ? replica_.step % every == 0 : end_of_epoch;
  if (!elastic_) {
    if (due) save_checkpoint();
    return;
  }
  // Elastic: a checkpoint resumes on any number of nodes only when the replicas are equal, so a
  // due checkpoint waits for the next step where they are (the same step on every rank).
  if (due && checkpoint_due_ < 0) checkpoint_due_ = replica_.step;
  // A streaming world level has no such step: its period starts stand for it, and
  // save_checkpoint averages the replicas there.
  if (checkpoint_due_ >= 0 &&
      ((at_world_boundary() && !(parallel_.averager && parallel_.averager->has_pending())) ||
       streaming_world_period_start())) {
    save_checkpoint();
    checkpoint_due_ = -1;
  }
}

void Loop::save_checkpoint(bool preemption) {
  if (!checkpointer_ || replica_.step <= last_saved_) return;
  const auto start = Clock::now();
  bool equal = at_world_boundary() && !(parallel_.averager && parallel_.averager->has_pending());
  if (elastic_ && !equal) {
    // A preemption between world averagings: the replicas are averaged first, so that the job
    // can resume on any number of nodes (as the survivors of a failure do).
    average_replicas_now();
    equal = true;
  }
  checkpointer_->save(replica_.step, {.replicas_equal = equal});
  last_saved_ = replica_.step;
  listener_->on_checkpoint({.lead = lead_,
                            .step = replica_.step,
                            .path = checkpoint::step_dir(checkpointer_->dir(), replica_.step),
                            .stall_seconds = seconds_since(start),
                            .preemption = preemption});
}

}  // namespace detail
}  // namespace hsgd::runtime
