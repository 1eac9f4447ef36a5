#pragma once
// MetricsLog: a training run's metrics as JSON lines (--metrics-out FILE.jsonl), one object per
// line, each line written with one fwrite and flushed, so a killed run leaves a valid file (at
// worst without its last line). Fields (absent when unknown, e.g. test_* between evaluations):
//   {"step": 200, "epoch": 2, "wall_s": 61.2, "train_s": 58.9, "train_loss": 0.4123,
//    "lr": 0.0871, "samples_per_s": 2211.5, "test_loss": 0.3512, "test_accuracy": 0.8731,
//    "averaging": [{"period": 2, "group_size": 2, "count": 90, "bytes": 98090640,
//                   "seconds": 1.25, "overlap_wait_seconds": 0.0, "peak_mb_per_s": 81.7}, ...]}
// step counts steps from the start of the run, epoch is 1-based, wall_s and train_s are seconds
// since the start (train_s without evaluations), train_loss is rank 0's mean loss over the steps
// since the previous record, test_accuracy a fraction, averaging the averager's cumulative
// level_stats() (an empty list in --mode ddp): "bytes" this rank sent at the level, and
// "peak_mb_per_s" the busiest 100 ms of the level's link (peak_bytes_per_second / 1e6). Non-finite
// numbers are written as null. Elastic runs add a "generation" object to the record of each
// generation they enter (see below).
//
// Resume: a run resumed from step S keeps the file's complete records with step <= S (those
// after S are trained again) and appends; wall_s and train_s continue from the last kept record.
//
// Usage:
//   const int64_t resumed_step = 0;   // or the step the run resumed from
//   apps::MetricsLog log("run.jsonl", resumed_step);
//   log.write({.step = 10, .epoch = 1, .wall_s = 3.2, .train_loss = 2.1});
//
// Errors: a file that cannot be written throws InvalidArgument naming the path.

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "framework/distributed/model_averaging/averagers.h"

namespace hsgd::apps {

struct MetricsRecord {
  int64_t step = 0;
  int64_t epoch = 0;
  double wall_s = 0;
  double train_s = 0;
  std::optional<double> train_loss = std::nullopt;
  std::optional<double> lr = std::nullopt;
  std::optional<double> samples_per_s = std::nullopt;
  std::optional<double> test_loss = std::nullopt;
  std::optional<double> test_accuracy = std::nullopt;
  std::vector<distributed::AveragingLevelStats> averaging = {};
  // Elastic runs (the runtime's generations, apps/common/training_run.h) write one record per
  // generation entered:
  //   "generation": {"number": 2, "nodes": 2, "workers": 4, "change": "lost node ...; joined
  //   node ...", "failure": true, "state_bytes": 4287628, "agreement_ms": 403.1}
  struct Generation {
    int64_t number = 0;
    int nodes = 0;
    int workers = 0;
    std::string change{};  // nodes lost and joined, "" for the first
    bool failure = false;  // entered after a failed generation
    int64_t state_bytes = 0;
    double agreement_ms = 0;
  };
  std::optional<Generation> generation = std::nullopt;
};

class MetricsLog {
 public:
  MetricsLog(const std::string& path, int64_t resumed_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void write(const MetricsRecord& record);

  // wall_s and train_s of the last record kept on resume (0 for a new file).
  double resumed_wall_s() const { return resumed_wall_s_; }
  double resumed_train_s() const { return resumed_train_s_; }

  // One record as a JSON object, without the newline.
  static std::string to_json(const MetricsRecord& record);

 private:
  const std::string path_;
  std::FILE* file_ = nullptr;
  double resumed_wall_s_ = 0, resumed_train_s_ = 0;
};

}  // namespace hsgd::apps
