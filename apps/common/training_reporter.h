#pragma once
// TrainingReporter: what rank 0 reports while the bundled examples train -- the progress line
// (progress_line.h), the --metrics-out records (metrics_log.h) and the "eval:" lines of
// --eval-every -- and the clocks behind them: wall time since the start and training time without
// evaluations. On other ranks every call only keeps the clocks.
//
// Usage:
//   apps::TrainingReporter reporter({.lead = rank == 0, .log_every = 50, .epochs = 3});
//   const int64_t step = 1, epoch = 1;
//   const double lr = 0.1;
//   reporter.after_step(step, epoch, loss.item(), lr);        // after each step
//   reporter.begin_eval();                                    // at each evaluation:
//   const apps::EvalResult result{.loss = 0.31, .accuracy = 0.89};
//   reporter.after_eval(step, epoch, result);
//   world->barrier()->wait();
//   reporter.end_eval();
//   reporter.print("other output\n");                        // erases the progress line first
//
// Records: one every log_every steps (mean loss and samples/s over the steps since the previous
// record) and one at every evaluation (with test_loss and test_accuracy).

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "apps/common/metrics_log.h"
#include "apps/common/progress_line.h"
#include "framework/distributed/model_averaging/averagers.h"
#include "framework/runtime/run_listener.h"

namespace hsgd::apps {

using EvalResult = runtime::EvalResult;

struct ReporterOptions {
  bool lead = false;  // rank 0: the only one that prints and writes
  int64_t log_every = 0;
  bool eval_lines = false;  // print "eval: epoch E step S train_s T test_accuracy A%"
  std::string metrics_out = "";
  int64_t total_steps = 0;
  int64_t epochs = 0;
  int64_t samples_per_step = 0;  // of the whole job: batch size x world size
  int64_t resumed_step = 0;
  const distributed::ModelAverager* averager = nullptr;  // for level_stats(); may be null
};

class TrainingReporter {
 public:
  explicit TrainingReporter(ReporterOptions options);

  // After the optimizer step that brought the run to `step` steps; lr is the one that step used.
  void after_step(int64_t step, int64_t epoch, double loss, double lr);
  // Stops the training clock (evaluations do not count in train_s nor in samples/s).
  void begin_eval();
  // Rank 0's evaluation result at `step`: the "eval:" line, a record, the progress's accuracy.
  void after_eval(int64_t step, int64_t epoch, const EvalResult& result);
  // Restarts the training clock.
  void end_eval();
  // A line of other output on rank 0 (erases the live progress line first).
  void print(const std::string& text);
  // Whether this process is rank 0 from now on: an elastic run's rank 0 moves to another process
  // when its node leaves. Printing follows it; the metrics file stays with the process that was
  // rank 0 at construction (elastic runs write their records themselves).
  void set_lead(bool lead) { lead_ = lead; }

  // Training seconds of this process so far, evaluations excluded.
  double train_seconds() const;

 private:
  using Clock = std::chrono::steady_clock;
  double since(Clock::time_point t) const;
  MetricsRecord record(int64_t step, int64_t epoch) const;

  const ReporterOptions options_;
  bool lead_;  // options_.lead, then set_lead()
  ProgressLine progress_;
  std::unique_ptr<MetricsLog> metrics_;
  double wall_offset_ = 0, train_offset_ = 0;  // from the metrics file of a resumed run

  const Clock::time_point start_;
  double eval_seconds_ = 0;  // spent in evaluations so far
  std::optional<Clock::time_point> eval_start_;
  double train_s_at_eval_ = 0;

  // Since the previous record.
  double loss_sum_ = 0;
  int64_t window_steps_ = 0;
  double window_start_train_s_ = 0;
  double lr_ = 0;
  double samples_per_s_ = 0;
  int64_t steps_this_run_ = 0;
  std::optional<double> test_accuracy_;
};

}  // namespace hsgd::apps
