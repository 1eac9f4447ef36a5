#include "apps/common/training_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <span>

#include "apps/common/preemption.h"
#include "comm/launcher/exit_codes.h"
#include "comm/launcher/worker_liveness.h"
#include "comm/process_group/work.h"
#include "framework/distributed/averaged_replicas.h"
#include "framework/nn/functional.h"
#include "framework/tensor/grad_mode.h"
#include "framework/tensor/ops.h"

namespace hsgd::apps {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string format_row(const char* fmt, auto... args) {
  char buffer[256];
  std::snprintf(buffer, sizeof buffer, fmt, args...);
  return buffer;
}

}  // namespace

EvalResult evaluate_shard(nn::Module& model, const data::Dataset& test, int64_t max_examples,
                          int shard, int shards, int64_t& examples) {
  NoGradGuard no_grad;
  model.eval();
  constexpr int64_t kChunk = 500;
  const int64_t limit = max_examples > 0 ? std::min(max_examples, test.size()) : test.size();
  EvalResult out;
  examples = 0;
  std::vector<int64_t> indices;
  for (int64_t i = shard; i < limit; i += shards) {
    indices.push_back(i);
    if (static_cast<int64_t>(indices.size()) < kChunk && i + shards < limit) continue;
    const data::Batch batch = test.get_batch(indices);
    const Tensor logits = model.forward(batch.inputs);
    const auto n = static_cast<double>(indices.size());
    out.loss += nn::cross_entropy(logits, batch.targets).item() * n;
    out.accuracy += nn::accuracy(logits, batch.targets) * n;
    examples += static_cast<int64_t>(indices.size());
    indices.clear();
  }
  model.train();
  return out;
}

EvalResult evaluate(nn::Module& model, const data::Dataset& test, int64_t max_examples) {
  int64_t examples = 0;
  EvalResult out = evaluate_shard(model, test, max_examples, 0, 1, examples);
  if (examples > 0) {
    out.loss /= static_cast<double>(examples);
    out.accuracy /= static_cast<double>(examples);
  }
  return out;
}

EvalResult train(const TrainingFlags& flags, const TrainingRun& run, TrainingEnd* end) {
  comm::ProcessGroup& world = *run.world;
  const int world_size = world.size();
  const bool lead = world.rank() == 0;
  data::DataLoader& loader = *run.loader;
  Optimizer& optimizer = *run.optimizer;
  const int64_t total_steps = planned_steps(flags, loader);

  // Steps trained so far: 0, or the step of the checkpoint resumed from.
  int64_t step = run.checkpoints->resume();
  int64_t first_epoch = 0;
  if (step > 0) {
    first_epoch = loader.epoch();
    if (loader.position() >= loader.num_batches()) ++first_epoch;
  }
  TrainingReporter reporter({.lead = lead,
                             .log_every = flags.log_every,
                             .eval_lines = flags.eval_every > 0,
                             .metrics_out = flags.metrics_out,
                             .total_steps = total_steps,
                             .epochs = flags.epochs,
                             .samples_per_step = loader.options().batch_size * world_size,
                             .resumed_step = step,
                             .averager = run.parallel->averager.get()});
  reporter.print(format_row("%5s %7s %10s %9s %10s %9s %8s %9s\n", "epoch", "steps", "train_loss",
                            "train_acc", "test_loss", "test_acc", "time_s", "images/s"));

  // SIGUSR1 / SIGTERM stop the run at a step boundary after a checkpoint, when it writes them.
  PreemptionCheck preemption(run.world, run.checkpoints->enabled());
  bool preempted = false;

  EvalResult eval;
  // Rank 0's result for the average of the replicas, parameters and buffers (BatchNorm
  // statistics) (collective). keep: every rank keeps the averaged values, else each restores its
  // own. An averaging still in flight (overlapped levels) is merged first when keeping.
  const auto evaluate_average = [&](bool keep) {
    if (keep && run.parallel->averager) {
      run.parallel->averager->finish_pending(run.model->parameters());
    }
    distributed::AveragedReplicas average(run.world, run.model);
    if (keep) average.keep();
    if (lead) eval = evaluate(*run.model, *run.test, flags.max_eval);
  };
  if (first_epoch >= flags.epochs || step >= total_steps) {  // nothing left to train
    evaluate_average(/*keep=*/true);
  }
  for (int64_t epoch = first_epoch; epoch < flags.epochs && step < total_steps; ++epoch) {
    loader.set_epoch(epoch);
    const auto start = Clock::now();
    double loss_sum = 0, correct = 0, step_seconds = 0;
    int64_t images = 0, steps = 0;
    for (const data::Batch& batch : loader) {
      if (step >= total_steps) break;
      const auto step_start = Clock::now();
      const double lr = optimizer.param_groups().front().lr.value_or(flags.lr);
      optimizer.zero_grad();
      const Tensor logits = run.parallel->forward(*run.model, batch.inputs);
      // A bad label names its sample's index in the data set too, which only the loader knows.
      check_class_targets(
          "cross_entropy", batch.targets, logits.size(1), std::nullopt,
          std::span<const int64_t>(loader.indices())
              .subspan(static_cast<size_t>((loader.position() - 1) * loader.options().batch_size),
                       batch.targets.size()));
      Tensor loss = nn::cross_entropy(logits, batch.targets);
      loss.backward();
      optimizer.step();
      if (run.scheduler != nullptr) run.scheduler->step();
      step_seconds += seconds_since(step_start);
      const auto n = static_cast<int64_t>(batch.targets.size());
      const double loss_value = loss.item();
      // This rank's loss; under a launcher the others are stopped when this rank exits.
      HSGD_CHECK(std::isfinite(loss_value) || flags.allow_nonfinite_loss, "the training loss is ",
                 loss_value, " at step ", step + 1, " (epoch ", epoch + 1, ", rank ", world.rank(),
                 ", lr ", lr,
                 "): training diverged; lower --lr, or pass --allow-nonfinite-loss "
                 "to continue anyway");
      loss_sum += loss_value * static_cast<double>(n);
      correct += nn::accuracy(logits, batch.targets) * static_cast<double>(n);
      images += n;
      ++step;
      ++steps;
      comm::report_progress(step);  // hsgd-run's hang detection and lost-step count
      run.checkpoints->after_step(step, loader.position() == loader.num_batches());
      reporter.after_step(step, epoch + 1, loss_value, lr);
      if (preemption.stop_now()) {
        preempted = true;
        break;
      }
      if (flags.eval_every > 0 && steps % flags.eval_every == 0 && steps < loader.num_batches() &&
          step < total_steps) {
        reporter.begin_eval();
        evaluate_average(/*keep=*/false);
        reporter.after_eval(step, epoch + 1, eval);
        world.barrier()->wait();
        reporter.end_eval();
      }
    }
    if (preempted) break;
    // Sums over ranks: every rank ran the same number of steps on its shard.
    std::vector<double> sums{loss_sum, correct, static_cast<double>(images), step_seconds};
    if (world_size > 1) world.allreduce(std::span<double>(sums))->wait();
    const double denom = sums[2] > 0 ? sums[2] : 1.0;
    const double job_step_seconds = sums[3] / world_size;
    const bool last = epoch + 1 == flags.epochs || step >= total_steps;
    reporter.begin_eval();
    evaluate_average(/*keep=*/last);
    reporter.after_eval(step, epoch + 1, eval);
    if (flags.eval_every > 0 && !last) world.barrier()->wait();
    reporter.end_eval();
    reporter.print(format_row("%5lld %7lld %10.4f %8.2f%% %10.4f %8.2f%% %8.2f %9.1f\n",
                              static_cast<long long>(epoch + 1), static_cast<long long>(steps),
                              sums[0] / denom, 100 * sums[1] / denom, eval.loss,
                              100 * eval.accuracy, seconds_since(start),
                              job_step_seconds > 0 ? sums[2] / job_step_seconds : 0.0));
  }
  if (preempted) {
    run.checkpoints->save_now(step);
    run.checkpoints->finish();
    if (lead) {
      const int sig = preemption_signal();
      std::printf(
          "preempted (%s%s): stopped at step %lld of %lld after a checkpoint in %s/step_%lld; "
          "exiting %d (resume with the same --checkpoint-dir)\n",
          sig != 0 ? "SIG" : "a signal to another rank", sig != 0 ? sigabbrev_np(sig) : "",
          static_cast<long long>(step), static_cast<long long>(total_steps),
          run.checkpoints->dir().c_str(), static_cast<long long>(step),
          comm::launcher::kExitPreempted);
      std::fflush(stdout);
    }
  } else {
    preemption.finish();
    run.checkpoints->finish();
  }
  if (end != nullptr) *end = TrainingEnd{.step = step, .preempted = preempted};
  return eval;
}

void print_report(const TrainingRun& run, const ParallelFlags& parallel, const EvalResult& result,
                  double wall_seconds) {
  if (run.world->rank() != 0) return;
  std::printf("final test accuracy: %.2f%%\n", 100 * result.accuracy);
  if (run.distributed) {
    std::printf("%s: %d ranks, mode %s, training wall time %.2f s (rank 0)\n", run.program.c_str(),
                run.world->size(), parallel.mode.c_str(), wall_seconds);
  }
  if (run.parallel->averager) print_averaging_stats(*run.parallel->averager);
  std::fflush(stdout);
}

int train_and_report(const TrainingFlags& flags, const TrainingRun& run,
                     const ParallelFlags& parallel) {
  const auto start = Clock::now();
  TrainingEnd end;
  const EvalResult result = train(flags, run, &end);
  if (!end.preempted) print_report(run, parallel, result, seconds_since(start));
  run.world->shutdown();
  return end.preempted ? comm::launcher::kExitPreempted : 0;
}

}  // namespace hsgd::apps
