#pragma once
// A single-process reference of the level-options rule (averaging_level.h) and of the schedule
// (averagers.h), written from those comments: it holds every rank's state, so each rank of a
// multi-process test can compute what every rank must hold after each step. Float32 arithmetic
// in the same order as the rule states; the group sums of uncompressed payloads are in rank
// order (an allreduce may sum in another order: compare those with a tolerance).

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "framework/distributed/model_averaging/compression.h"
#include "framework/distributed/model_averaging/level_options.h"

namespace hsgd::distributed::testing {

// The group mean of a compressed averaging as compressed_average.h states it, for the members
// of one group: payload[m] is member m's payload (members in group order, global ranks
// first_rank, first_rank + 1, ...), node_sizes the job's nodes (node i: the next node_sizes[i]
// contiguous global ranks; empty: one node). residual[m] is member m's error-feedback residual
// (used and updated on node leaders) when error_feedback is set. Float32 operations in the
// order the rule and the code take them.
inline std::vector<float> reference_compressed_mean(const std::vector<std::vector<float>>& payload,
                                                    int first_rank,
                                                    const std::vector<int>& node_sizes,
                                                    Compression compression, float scale,
                                                    bool error_feedback,
                                                    std::vector<std::vector<float>>& residual) {
  const size_t g = payload.size(), n = payload[0].size();
  const auto node_of = [&](int rank) {
    int node = 0;
    for (int end = 0; node < static_cast<int>(node_sizes.size()); ++node) {
      end += node_sizes[static_cast<size_t>(node)];
      if (rank < end) break;
    }
    return node_sizes.empty() ? 0 : node;
  };
  std::vector<std::vector<size_t>> nodes;
  int last = -1;
  for (size_t m = 0; m < g; ++m) {
    const int node = node_of(first_rank + static_cast<int>(m));
    if (nodes.empty() || node != last) nodes.emplace_back();
    nodes.back().push_back(m);
    last = node;
  }
  // 1. node sums, in rank order
  std::vector<std::vector<float>> sums;
  for (const auto& members : nodes) {
    std::vector<float> s = payload[members[0]];
    for (size_t k = 1; k < members.size(); ++k) {
      for (size_t i = 0; i < n; ++i) s[i] += payload[members[k]][i];
    }
    sums.push_back(s);
  }
  // 2. the ring: chunk k visits leaders k, k+1, ..., k+N-1; each leader encodes the chunk's
  // values once (a block format quantizes them in blocks counted from the chunk's start)
  const size_t big_n = nodes.size();
  std::vector<float> total = sums[0];
  if (big_n > 1) {
    const size_t c = (n + big_n - 1) / big_n;
    for (size_t k = 0; k < big_n; ++k) {
      const size_t begin = std::min(n, k * c), end = std::min(n, (k + 1) * c);
      std::vector<float> decoded(end - begin, 0.0f);
      for (size_t j = 0; j < big_n; ++j) {
        const size_t node = (k + j) % big_n;
        std::vector<float>& e = residual[nodes[node][0]];
        std::vector<float> v(end - begin);
        for (size_t i = begin; i < end; ++i) {
          float a = 0.0f;
          if (j > 0) a += decoded[i - begin];
          a += sums[node][i];
          v[i - begin] = error_feedback ? a + e[i] : a;
        }
        decoded = round_trip(compression, scale, v);
        if (error_feedback) {
          for (size_t i = begin; i < end; ++i) e[i] = v[i - begin] - decoded[i - begin];
        }
      }
      std::copy(decoded.begin(), decoded.end(), total.begin() + static_cast<std::ptrdiff_t>(begin));
    }
  }
  // 4. mean
  for (float& v : total) v /= static_cast<float>(g);
  return total;
}

class ReferenceAverager {
 public:
  using Values = std::vector<float>;  // one rank's flat parameters

  // node_sizes: the nodes compressed levels see (contiguous ranks; empty: one node).
  ReferenceAverager(std::vector<LevelOptions> levels, int world, std::vector<int> node_sizes = {})
      : world_(world), node_sizes_(std::move(node_sizes)) {
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
      if (is_anchored(l.o) && !l.first && l.o.compression != Compression::kNone) {
        std::vector<Values> payload;
        std::vector<Values> residual;
        for (int r = first; r < first + g; ++r) {
          payload.emplace_back(n);
          for (size_t i = 0; i < n; ++i) payload.back()[i] = l.anchor[r][i] - x[r][i];
          if (l.o.error_feedback && l.residual[r].empty()) l.residual[r].assign(n, 0.0f);
          residual.push_back(l.residual[r]);
        }
        sum = reference_compressed_mean(payload, first, node_sizes_, l.o.compression,
                                        l.o.compression_scale, l.o.error_feedback, residual);
        for (int r = first; r < first + g; ++r) l.residual[r] = residual[r - first];
      } else {
        for (int r = first; r < first + g; ++r) {
          for (size_t i = 0; i < n; ++i) {
            if (!is_anchored(l.o) || l.first) {
              sum[i] += x[r][i] / static_cast<float>(g);
            } else {
              sum[i] += (l.anchor[r][i] - x[r][i]) / static_cast<float>(g);
            }
          }
        }
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
  const std::vector<int> node_sizes_;
  std::vector<Level> levels_;
};

}  // namespace hsgd::distributed::testing
