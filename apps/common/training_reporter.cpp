#include "apps/common/training_reporter.h"

#include <cstdio>

namespace hsgd::apps {

TrainingReporter::TrainingReporter(ReporterOptions options)
    : options_(std::move(options)),
      lead_(options_.lead),
      progress_(ProgressLine::detect(options_.lead, options_.log_every), options_.log_every),
      start_(Clock::now()) {
  if (options_.lead && !options_.metrics_out.empty()) {
    metrics_ = std::make_unique<MetricsLog>(options_.metrics_out, options_.resumed_step);
    wall_offset_ = metrics_->resumed_wall_s();
    train_offset_ = metrics_->resumed_train_s();
  }
}

double TrainingReporter::since(Clock::time_point t) const {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double TrainingReporter::train_seconds() const {
  if (eval_start_) return train_s_at_eval_;
  return since(start_) - eval_seconds_;
}

MetricsRecord TrainingReporter::record(int64_t step, int64_t epoch) const {
  MetricsRecord r{.step = step,
                  .epoch = epoch,
                  .wall_s = wall_offset_ + since(start_),
                  .train_s = train_offset_ + train_seconds(),
                  .lr = lr_};
  if (options_.averager != nullptr) r.averaging = options_.averager->level_stats();
  return r;
}

void TrainingReporter::after_step(int64_t step, int64_t epoch, double loss, double lr) {
  ++steps_this_run_;
  if (!lead_) return;
  loss_sum_ += loss;
  ++window_steps_;
  lr_ = lr;
  const double train_s = train_seconds();
  const double window_s = train_s - window_start_train_s_;
  if (window_s > 0) {
    samples_per_s_ = static_cast<double>(window_steps_ * options_.samples_per_step) / window_s;
  }
  const double mean_loss = loss_sum_ / static_cast<double>(window_steps_);
  const double eta = train_s / static_cast<double>(steps_this_run_) *
                     static_cast<double>(options_.total_steps - step);
  progress_.update({.step = step,
                    .total_steps = options_.total_steps,
                    .epoch = epoch,
                    .epochs = options_.epochs,
                    .loss = mean_loss,
                    .lr = lr,
                    .samples_per_s = samples_per_s_,
                    .eta_s = eta,
                    .test_accuracy = test_accuracy_});
  if (options_.log_every > 0 && step % options_.log_every == 0) {
    if (metrics_) {
      MetricsRecord r = record(step, epoch);
      r.train_loss = mean_loss;
      r.samples_per_s = samples_per_s_;
      metrics_->write(r);
    }
    loss_sum_ = 0;
    window_steps_ = 0;
    window_start_train_s_ = train_s;
  }
}

void TrainingReporter::begin_eval() {
  train_s_at_eval_ = train_seconds();
  eval_start_ = Clock::now();
}

void TrainingReporter::after_eval(int64_t step, int64_t epoch, const EvalResult& result) {
  if (!lead_) return;
  test_accuracy_ = result.accuracy;
  if (options_.eval_lines) {
    char line[160];
    std::snprintf(line, sizeof line,
                  "eval: epoch %lld step %lld train_s %.3f test_accuracy %.2f%% test_loss %.4f\n",
                  static_cast<long long>(epoch), static_cast<long long>(step), train_seconds(),
                  100 * result.accuracy, result.loss);
    progress_.print(line);
  }
  if (metrics_) {
    MetricsRecord r = record(step, epoch);
    r.test_loss = result.loss;
    r.test_accuracy = result.accuracy;
    metrics_->write(r);
  }
}

void TrainingReporter::end_eval() {
  if (!eval_start_) return;
  eval_seconds_ += since(*eval_start_);
  eval_start_.reset();
}

void TrainingReporter::print(const std::string& text) {
  if (lead_) progress_.print(text);
}

}  // namespace hsgd::apps
