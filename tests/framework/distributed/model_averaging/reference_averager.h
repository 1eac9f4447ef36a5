#pragma once
// A single-process reference of the level-options rule (averaging_level.h) and of the schedule
// (averagers.h), written from those comments: it holds every rank's state, so each rank of a
// multi-process test can compute what every rank must hold after each step. Float32 arithmetic
// in the same order as the rule states; the group sums of uncompressed payloads are in rank
// order (an allreduce may sum in another order: compare those with a tolerance).

#include <cstdint>
#include <optional>
#include <vector>

#include "framework/distributed/model_averaging/compression.h"
#include "framework/distributed/model_averaging/level_options.h"

namespace hsgd::distributed::testing {

class ReferenceAverager {
 public:
  using Values = std::vector<float>;  // one rank's flat parameters

  ReferenceAverager(std::vector<LevelOptions> levels, int world) : world_(world) {
    for (const LevelOptions& o : levels) levels_.push_back(Level{.o = o});
    for (Level& l : levels_) {
      l.anchor.resize(world);
      l.momentum.resize(world);
      l.residual.resize(world);
      l.snapshot.resize(world);
      l.mean.resize(world);
    }
  }

  // One call of average_parameters at `step` in which `level` averages (-1: none); x[r] is rank
  // r's parameters, updated in place.
  void step(int64_t step, int level, std::vector<Values>& x) {
    for (size_t l = 0; l < levels_.size(); ++l) {
      if (levels_[l].pending && levels_[l].due <= step) complete(l, x);
    }
    if (level < 0) return;
    for (int l = 0; l <= level; ++l) {
      if (levels_[l].pending) complete(static_cast<size_t>(l), x);
    }
    start(static_cast<size_t>(level), step, x);
    if (levels_[level].o.overlap_steps == 0) complete(static_cast<size_t>(level), x);
  }

 private:
  struct Level {
    LevelOptions o;
    bool has_anchor = false, has_momentum = false, pending = false, first = false;
    int64_t due = 0;
    std::vector<Values> anchor = {}, momentum = {}, residual = {}, snapshot = {}, mean = {};
  };

  void start(size_t index, int64_t step, std::vector<Values>& x) {
    Level& l = levels_[index];
    const int g = l.o.group_size;
    const size_t n = x[0].size();
    l.first = is_anchored(l.o) && !l.has_anchor;
    for (int first = 0; first < world_; first += g) {
      Values sum(n, 0.0f);
      for (int r = first; r < first + g; ++r) {
        for (size_t i = 0; i < n; ++i) {
          if (!is_anchored(l.o) || l.first) {
            sum[i] += x[r][i] / static_cast<float>(g);
          } else if (l.o.compression == Compression::kNone) {
            sum[i] += (l.anchor[r][i] - x[r][i]) / static_cast<float>(g);
          } else {
            if (l.o.error_feedback && l.residual[r].empty()) l.residual[r].assign(n, 0.0f);
            float v = l.anchor[r][i] - x[r][i];
            if (l.o.error_feedback) v += l.residual[r][i];
            const float s = l.o.compression_scale;
            const float decoded = round_trip(l.o.compression, v * s) / s;
            if (l.o.error_feedback) l.residual[r][i] = v - decoded;
            sum[i] += decoded;
          }
        }
      }
      if (is_anchored(l.o) && !l.first && l.o.compression != Compression::kNone) {
        for (float& v : sum) v /= static_cast<float>(g);
      }
      for (int r = first; r < first + g; ++r) l.mean[r] = sum;
    }
    for (int r = 0; r < world_; ++r) l.snapshot[r] = x[r];
    l.pending = true;
    l.due = step + l.o.overlap_steps;
  }

  void complete(size_t index, std::vector<Values>& x) {
    for (size_t below = 0; below < index; ++below) {
      if (levels_[below].pending) complete(below, x);
    }
    Level& l = levels_[index];
    const OuterOptimizer outer = l.o.outer.value_or(OuterOptimizer{});
    const auto lr = static_cast<float>(outer.lr), m = static_cast<float>(outer.momentum);
    const bool first_momentum = !l.has_momentum;
    for (int r = 0; r < world_; ++r) {
      Values result = l.mean[r];
      if (is_anchored(l.o)) {
        if (l.first) {
          l.anchor[r] = l.mean[r];
        } else {
          if (m != 0.0f && first_momentum) l.momentum[r] = l.mean[r];
          for (size_t i = 0; i < result.size(); ++i) {
            float d = l.mean[r][i];
            if (m != 0.0f) {
              if (!first_momentum) l.momentum[r][i] = l.momentum[r][i] * m + d;
              d = outer.nesterov ? d + m * l.momentum[r][i] : l.momentum[r][i];
            }
            l.anchor[r][i] = l.anchor[r][i] + (-lr) * d;
          }
        }
        result = l.anchor[r];
      }
      for (size_t i = 0; i < result.size(); ++i) {
        x[r][i] = l.o.overlap_steps == 0 ? result[i] : result[i] + (x[r][i] - l.snapshot[r][i]);
      }
      for (size_t below = 0; below < index; ++below) {
        if (is_anchored(levels_[below].o)) {
          levels_[below].anchor[r] = result;
          levels_[below].has_anchor = true;
        }
      }
    }
    if (is_anchored(l.o) && !l.first && m != 0.0f) l.has_momentum = true;
    if (is_anchored(l.o)) l.has_anchor = true;
    l.pending = false;
  }

  const int world_;
  std::vector<Level> levels_;
};

}  // namespace hsgd::distributed::testing
