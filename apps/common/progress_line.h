#pragma once
// ProgressLine: rank 0's view of a training run on stdout, in one of three styles.
//   kLive   (stdout is a terminal) one line redrawn in place with '\r' after every step, at most
//           ten times a second:
//             epoch 2/3 | step 41/96 | loss 0.5123 | lr 0.0473 | 1234 samples/s | ETA 0:12 |
//             test acc 85.10%
//           cut to the terminal's width so that it never wraps.
//   kPlain  (a pipe or file: CI, hsgd-run's prefixed output) one line every log_every steps:
//             "  step 41 loss 0.5123 | epoch 2/3, 41/96 steps, lr 0.0473, 1234 samples/s,
//              ETA 0:12, test acc 85.10%"   (one line; "  step N loss L" first, as scripts grep)
//   kOff    nothing (other ranks, --log-every 0).
// Other output goes through print() (or after clear()), which erases the live line first; the
// next update() draws it again.
//
// Usage:
//   const int64_t log_every = 50;
//   apps::ProgressLine progress(apps::ProgressLine::detect(rank == 0, log_every), log_every);
//   progress.update({.step = 41, .total_steps = 96, .epoch = 2, .epochs = 3, .loss = 0.51});

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace hsgd::apps {

struct ProgressState {
  int64_t step = 0;  // steps trained so far, counted from the start of the run
  int64_t total_steps = 0;
  int64_t epoch = 0;  // 1-based
  int64_t epochs = 0;
  double loss = 0;  // mean training loss since the previous plain line
  double lr = 0;
  double samples_per_s = 0;
  double eta_s = -1;                                   // < 0: unknown
  std::optional<double> test_accuracy = std::nullopt;  // fraction, of the last evaluation
};

class ProgressLine {
 public:
  enum class Style { kLive, kPlain, kOff };
  // kOff unless enabled (rank 0) and log_every > 0; then kLive when stdout is a terminal.
  static Style detect(bool enabled, int64_t log_every);

  ProgressLine(Style style, int64_t log_every);
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // After each step (see the file comment for what each style prints).
  void update(const ProgressState& state);
  // Erases the live line, if drawn.
  void clear();
  // clear(), then text (a whole line, '\n' included) and a flush.
  void print(const std::string& text);

  Style style() const { return style_; }
  // "1:02:03", "2:03" or "?" for a negative number of seconds.
  static std::string format_duration(double seconds);

 private:
  const Style style_;
  const int64_t log_every_;
  bool drawn_ = false;     // a live line is on screen
  double last_draw_ = -1;  // steady-clock seconds of the last live draw
};

}  // namespace hsgd::apps
