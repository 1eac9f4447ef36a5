#include "apps/common/training_run.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>

#include "comm/launcher/exit_codes.h"
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
  char buffer[512];
  std::snprintf(buffer, sizeof buffer, fmt, args...);
  return buffer;
}

// What rank 0 prints and writes while the Runtime trains (every rank keeps the clocks).
class Printer : public runtime::RunListener {
 public:
  Printer(const TrainingFlags& training, const TrainingProgram& program)
      : training_(training), program_(program) {}

  void on_generation(const runtime::GenerationEvent& e) override {
    averager_ = e.parallel->averager.get();
    if (!reporter_) {
      if (e.lead && program_.print_header) program_.print_header(e);
      reporter_.emplace(
          ReporterOptions{.lead = e.lead,
                          .log_every = e.elastic ? 0 : training_.log_every,
                          .eval_lines = training_.eval_every > 0,
                          .metrics_out = training_.metrics_out,
                          .total_steps = e.total_steps,
                          .epochs = training_.epochs,
                          .samples_per_step = program_.loader.batch_size * e.world_size,
                          .resumed_step = e.step,
                          .averager = averager_});
      if (!e.elastic && !e.resumed_from.empty() && e.lead) {
        reporter_->print(format_row("resumed from %s (epoch %lld, step %lld)%s\n",
                                    e.resumed_from.c_str(), static_cast<long long>(e.epoch + 1),
                                    static_cast<long long>(e.step),
                                    e.resized ? " on a different number of workers" : ""));
      }
      reporter_->print(e.elastic ? format_row("%5s %7s %10s %9s %10s %9s\n", "epoch", "steps",
                                              "train_loss", "train_acc", "test_loss", "test_acc")
                                 : format_row("%5s %7s %10s %9s %10s %9s %8s %9s\n", "epoch",
                                              "steps", "train_loss", "train_acc", "test_loss",
                                              "test_acc", "time_s", "images/s"));
    }
    reporter_->set_lead(e.lead);
    if (!e.lead) metrics_.reset();
    elastic_ = e.elastic;
    if (!e.elastic) return;
    std::string levels;
    if (averager_ != nullptr) {
      for (const auto& level : averager_->level_stats()) {
        levels += (levels.empty() ? "" : ", ") + std::to_string(level.period) + ":" +
                  std::to_string(level.group_size);
      }
      levels = ", levels {" + levels + "}";
    }
    if (e.lead) {
      const std::string change = e.change.empty() ? "" : " " + e.change + ";";
      const std::string failure = e.after_failure ? str_cat(" after a failure (", e.thrown_away,
                                                            " worker-steps thrown away)")
                                                  : "";
      reporter_->print(format_row(
          "%s: generation %lld:%s %d nodes, %d workers%s, at step %lld of %lld%s; %s; agreement "
          "%.0f "
          "ms; "
          "replica hash %016llx equal on all %d ranks\n",
          program_.program.c_str(), static_cast<long long>(e.number), change.c_str(), e.nodes,
          e.world_size, levels.c_str(), static_cast<long long>(e.step),
          static_cast<long long>(e.total_steps), failure.c_str(), e.agreement.c_str(),
          e.agreement_ms, static_cast<unsigned long long>(e.replica_hash), e.world_size));
    }
    write_generation(e);
  }

  void on_step(const runtime::StepEvent& e) override {
    reporter_->after_step(e.step, e.epoch + 1, e.loss, e.lr);
    if (!elastic_ || !e.lead || training_.log_every <= 0 || e.step % training_.log_every != 0) {
      return;
    }
    write({.step = e.step, .epoch = e.epoch + 1, .train_loss = e.loss, .lr = e.lr});
    reporter_->print(format_row("[%s] step %lld loss %.4f (generation %lld, %d ranks)\n",
                                program_.program.c_str(), static_cast<long long>(e.step), e.loss,
                                static_cast<long long>(e.generation), e.world_size));
  }

  void on_eval_begin() override { reporter_->begin_eval(); }
  void on_eval(const runtime::EvalEvent& e) override {
    reporter_->after_eval(e.step, e.epoch + 1, e.result);
  }
  void on_eval_end() override { reporter_->end_eval(); }

  void on_epoch(const runtime::EpochEvent& e) override {
    if (elastic_) {
      reporter_->print(format_row(
          "%5lld %7lld %10.4f %8.2f%% %10.4f %8.2f%%  (%d ranks)\n",
          static_cast<long long>(e.epoch + 1), static_cast<long long>(e.step), e.train_loss,
          100 * e.train_accuracy, e.eval.loss, 100 * e.eval.accuracy, e.world_size));
      return;
    }
    reporter_->print(format_row("%5lld %7lld %10.4f %8.2f%% %10.4f %8.2f%% %8.2f %9.1f\n",
                                static_cast<long long>(e.epoch + 1),
                                static_cast<long long>(e.steps), e.train_loss,
                                100 * e.train_accuracy, e.eval.loss, 100 * e.eval.accuracy,
                                e.seconds, e.images_per_second));
  }

  void on_checkpoint(const runtime::CheckpointEvent& e) override {
    if (!e.lead) return;
    reporter_->print(
        format_row("checkpoint: step %lld -> %s%s (written in the background; "
                   "training stalled %.1f ms)\n",
                   static_cast<long long>(e.step), e.path.c_str(),
                   e.preemption ? " on the preemption signal" : "", 1000 * e.stall_seconds));
  }

  const distributed::ModelAverager* averager() const { return averager_; }

 private:
  // Elastic runs: their own records (the reporter's clock spans generations).
  void write(MetricsRecord record) {
    if (training_.metrics_out.empty()) return;
    // A process that becomes rank 0 in a later generation keeps the records up to this step
    // (they are there when the nodes share the file system).
    if (!metrics_) metrics_ = std::make_unique<MetricsLog>(training_.metrics_out, record.step);
    record.wall_s = record.train_s = seconds_since(start_);
    if (averager_ != nullptr) record.averaging = averager_->level_stats();
    metrics_->write(record);
  }
  void write_generation(const runtime::GenerationEvent& e) {
    if (!e.lead) return;
    write({.step = e.step,
           .epoch = e.epoch + 1,
           .generation = MetricsRecord::Generation{.number = e.number,
                                                   .nodes = e.nodes,
                                                   .workers = e.world_size,
                                                   .change = e.change,
                                                   .failure = e.after_failure,
                                                   .state_bytes = e.state_bytes,
                                                   .agreement_ms = e.agreement_ms}});
  }

  const TrainingFlags& training_;
  const TrainingProgram& program_;
  std::optional<TrainingReporter> reporter_;
  std::unique_ptr<MetricsLog> metrics_;
  const distributed::ModelAverager* averager_ = nullptr;
  bool elastic_ = false;
  const Clock::time_point start_ = Clock::now();
};

}  // namespace

LogitRows logit_rows(const data::Batch& batch,
                     const std::function<Tensor(const data::Batch&)>& forward) {
  const Tensor out = forward(batch);
  if (!batch.input_ids.defined()) return {out, batch.targets};
  return {out.reshape({-1, out.size(-1)}), batch.target_ids.to_vector()};
}

runtime::EvalSums evaluate_shard(nn::Module& model, const data::Dataset& test, int64_t max_examples,
                                 int shard, int shards) {
  NoGradGuard no_grad;
  model.eval();
  constexpr int64_t kChunk = 500;
  const int64_t limit = max_examples > 0 ? std::min(max_examples, test.size()) : test.size();
  runtime::EvalSums out;
  std::vector<int64_t> indices;
  for (int64_t i = shard; i < limit; i += shards) {
    indices.push_back(i);
    if (static_cast<int64_t>(indices.size()) < kChunk && i + shards < limit) continue;
    const LogitRows rows = logit_rows(test.get_batch(indices), [&](const data::Batch& b) {
      return b.input_ids.defined() ? model.forward(b.input_ids) : model.forward(b.inputs);
    });
    const auto n = static_cast<double>(rows.targets.size());
    out.loss_sum += nn::cross_entropy(rows.logits, rows.targets).item() * n;
    out.correct += nn::accuracy(rows.logits, rows.targets) * n;
    out.examples += static_cast<int64_t>(rows.targets.size());
    indices.clear();
  }
  model.train();
  return out;
}

EvalResult evaluate(nn::Module& model, const data::Dataset& test, int64_t max_examples) {
  const runtime::EvalSums sums = evaluate_shard(model, test, max_examples, 0, 1);
  if (sums.examples == 0) return {};
  const auto n = static_cast<double>(sums.examples);
  return {.loss = sums.loss_sum / n, .accuracy = sums.correct / n};
}

int train_and_report(const TrainingFlags& training, const ParallelFlags& parallel,
                     const CheckpointFlags& checkpoint, TrainingProgram program) {
  const auto start = Clock::now();
  const std::shared_ptr<const data::Dataset> test = program.test;
  const int64_t max_eval = training.max_eval;
  runtime::Runtime rt(
      {.parallel = parallel_options(parallel),
       .loader = program.loader,
       .epochs = training.epochs,
       .max_steps = training.max_steps,
       .checkpoint = checkpoint_options(checkpoint),
       .model_name = program.model_name,
       .hierarchy_text = parallel.hierarchy,
       .configuration = str_cat(describe_optimizer(training), ", lr ", training.lr, ", batch ",
                                training.batch_size, ", schedule ", training.schedule),
       .evaluate =
           [test, max_eval](nn::Module& model, int shard, int shards) {
             return evaluate_shard(model, *test, max_eval, shard, shards);
           },
       .eval_every = training.eval_every,
       .allow_nonfinite_loss = training.allow_nonfinite_loss});
  rt.register_model(program.model, program.average_buffers);
  rt.register_optimizer(make_optimizer(training, program.model->parameters()));
  rt.register_scheduler([&training](Optimizer& optimizer, int64_t total_steps) {
    return std::unique_ptr<runtime::Scheduler>(make_scheduler(training, optimizer, total_steps));
  });
  Printer printer(training, program);
  runtime::RunResult result;
  try {
    result = rt.run(
        program.train,
        [](runtime::StepContext& step, const data::Batch& batch) {
          const LogitRows rows = logit_rows(batch, [&](const data::Batch& b) {
            return b.input_ids.defined() ? step.forward(b.input_ids) : step.forward(b.inputs);
          });
          // A bad label names its sample's index in the data set too.
          if (!batch.input_ids.defined()) {
            check_class_targets("cross_entropy", rows.targets, rows.logits.size(1), std::nullopt,
                                step.indices());
          }
          Tensor loss = nn::cross_entropy(rows.logits, rows.targets);
          loss.backward();
          step.record_accuracy(nn::accuracy(rows.logits, rows.targets));
          return loss;
        },
        &printer);
  } catch (const runtime::ParallelMismatch& e) {
    throw BadFlag(describe_mismatch(parallel, e));
  } catch (const runtime::NoFullBatch&) {
    throw BadFlag(str_cat("--batch-size ", training.batch_size,
                          " per worker: this worker's share of the training set",
                          training.train_subset > 0
                              ? str_cat(" (--train-subset ", training.train_subset, ")")
                              : std::string(),
                          " holds no full batch; expected a batch size no larger than that share"));
  } catch (const runtime::ConfigurationMismatch& e) {
    std::fprintf(stderr, "%s: error: %s\n", program.program.c_str(), e.what());
    return comm::launcher::kExitWillRepeat;
  } catch (const runtime::TrainingStateLost& e) {
    std::fprintf(stderr, "%s: error: %s\n", program.program.c_str(), e.what());
    return comm::launcher::kExitWillRepeat;
  }
  const bool lead = result.rank == 0;
  if (result.preempted) {
    if (lead) {
      const int sig = result.preemption_signal;
      std::printf(
          "preempted (%s%s): stopped at step %lld of %lld after a checkpoint in %s; exiting %d "
          "(resume with the same --checkpoint-dir)\n",
          sig != 0 ? "SIG" : "a signal to another rank", sig != 0 ? sigabbrev_np(sig) : "",
          static_cast<long long>(result.step), static_cast<long long>(result.total_steps),
          result.checkpoint.c_str(), comm::launcher::kExitPreempted);
      std::fflush(stdout);
    }
    return comm::launcher::kExitPreempted;
  }
  if (lead) {
    std::printf("final test accuracy: %.2f%% test_loss %.4f\n", 100 * result.final_eval.accuracy,
                result.final_eval.loss);
    if (runtime::Runtime::elastic_in_env()) {
      std::printf(
          "%s: elastic, %lld generations, %d ranks at the end, mode %s, training wall time "
          "%.2f s (rank 0)\n",
          program.program.c_str(), static_cast<long long>(result.generations), result.world_size,
          parallel.mode.c_str(), seconds_since(start));
      std::printf("%s: replica hash %016llx at step %lld\n", program.program.c_str(),
                  static_cast<unsigned long long>(result.replica_hash),
                  static_cast<long long>(result.step));
    } else if (result.world_size > 1 || parallel.mode != "ddp") {
      std::printf("%s: %d ranks, mode %s, training wall time %.2f s (rank 0)\n",
                  program.program.c_str(), result.world_size, parallel.mode.c_str(),
                  seconds_since(start));
    }
    if (!result.averaging.empty()) print_averaging_stats(result.averaging);
    if (program.print_footer) program.print_footer(result);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace hsgd::apps
