// ModelAverager's schedule of levels with options and fragments (averagers.h states it): which
// units start and complete at a step, the order of the collectives, the anchors of the levels
// below. The arithmetic of one unit is AveragingLevel's (averaging_level.h).

#include <algorithm>
#include <chrono>
#include <utility>

#include "comm/error.h"
#include "framework/distributed/flat_buffer.h"
#include "framework/distributed/model_averaging/averagers.h"
#include "framework/distributed/model_averaging/averaging_level.h"
#include "framework/distributed/replica_check.h"

namespace hsgd::distributed {

bool ModelAverager::has_pending() const {
  for (const auto& units : levels_) {
    for (const auto& unit : units) {
      if (unit->pending()) return true;
    }
  }
  return false;
}

detail::Fragment ModelAverager::part(size_t level, size_t f) const {
  if (fragments_[level].empty()) {
    return detail::Fragment{
        .offset = 0, .size = static_cast<int64_t>(x_.size()), .n_params = n_params_};
  }
  return fragments_[level][f];
}

std::string ModelAverager::unit_prefix(size_t level, size_t f) const {
  const std::string prefix = "levels." + std::to_string(level) + ".";
  return levels_[level].size() == 1 ? prefix : prefix + "fragments." + std::to_string(f) + ".";
}

std::vector<Tensor> ModelAverager::pack(const std::vector<Tensor>& params) {
  std::vector<Tensor> tensors = get_params_to_average(params);
  n_params_ = flat_numel(tensors);
  std::vector<int64_t> sizes;
  sizes.reserve(tensors.size());
  for (const Tensor& t : tensors) sizes.push_back(t.numel());
  tensors.insert(tensors.end(), options_.average_buffers.begin(), options_.average_buffers.end());
  x_.resize(static_cast<size_t>(flat_numel(tensors)));
  flatten_into(tensors, x_);
  const auto n_buffers = static_cast<int64_t>(x_.size()) - n_params_;
  if (sizes != param_sizes_ || n_buffers != n_buffers_) {
    // The same shapes on every rank (check_tensors_once), so the same split.
    for (size_t l = 0; l < levels_.size(); ++l) {
      if (levels_[l].size() == 1) continue;
      fragments_[l] = detail::split_fragments(
          sizes, n_buffers, static_cast<int64_t>(levels_[l].size()),
          str_cat(class_name_, " level ", l, " (", describe(level_options_[l]), ")"));
    }
    param_sizes_ = std::move(sizes);
    n_buffers_ = n_buffers;
  }
  return tensors;
}

void ModelAverager::reset_anchors_below(size_t level, std::span<const float> r, size_t at) {
  const size_t end = at + r.size();
  for (size_t below = 0; below < level; ++below) {
    for (size_t f = 0; f < levels_[below].size(); ++f) {
      const detail::Fragment p = part(below, f);
      const auto begin = static_cast<size_t>(p.offset);
      const size_t stop = begin + static_cast<size_t>(p.size);
      const size_t lo = std::max(at, begin);
      const size_t hi = std::min(end, stop);
      if (lo == begin && hi == stop) {
        levels_[below][f]->reset_anchor(r.subspan(begin - at, stop - begin));
      } else if (lo < hi) {
        levels_[below][f]->reset_anchor_part(r.subspan(lo - at, hi - lo), lo - begin);
      }
    }
  }
}

void ModelAverager::complete_unit(size_t level, size_t f) {
  for (size_t below = 0; below < level; ++below) {
    for (size_t g = 0; g < levels_[below].size(); ++g) {
      if (levels_[below][g]->pending()) complete_unit(below, g);
    }
  }
  const auto start = std::chrono::steady_clock::now();
  detail::AveragingLevel& current = *levels_[level][f];
  const bool overlapped = current.delay() > 0;
  const double waited = current.receive();
  if (overlapped) stats_[level].overlap_wait_seconds += waited;
  const detail::Fragment p = part(level, f);
  const std::span<const float> result = current.complete(
      std::span<float>(x_).subspan(static_cast<size_t>(p.offset), static_cast<size_t>(p.size)));
  if (const auto transfer = current.take_transfer()) {
    peaks_[level].add(transfer->start, transfer->end, transfer->bytes);
    stats_[level].peak_bytes_per_second = peaks_[level].bytes_per_second();
  }
  reset_anchors_below(level, result, static_cast<size_t>(p.offset));
  if (!overlapped && levels_[level].size() == 1 && current.group()->size() == pg_->size()) {
    whole_group_step_ = step_;
  }
  const std::chrono::duration<double> spent = std::chrono::steady_clock::now() - start;
  stats_[level].seconds += spent.count();
}

namespace {

// start_from applies to compressed levels without an outer optimizer: with lr 1 and no
// momentum, A - mean(A - x) is mean(x) whatever the anchor A, so a common start changes only
// what goes on the wire.
bool takes_start(const LevelOptions& level) {
  return level.compression != Compression::kNone && !level.outer.has_value();
}

}  // namespace

bool ModelAverager::start_from(const std::vector<Tensor>& params) {
  if (std::none_of(level_options_.begin(), level_options_.end(), takes_start) || step_ != 0 ||
      has_pending()) {
    return false;
  }
  // Every parameter (which of them get a gradient is known only after the first backward) and
  // the buffers: each rank must hold the same values, bit for bit.
  std::vector<Tensor> tensors;
  for (const Tensor& t : params) {
    if (t.defined()) tensors.push_back(t);
  }
  tensors.insert(tensors.end(), options_.average_buffers.begin(), options_.average_buffers.end());
  if (!detail::same_values_on_all_ranks(*pg_, tensors, "start_from fingerprint")) return false;
  std::vector<std::pair<Tensor, std::vector<float>>> values;
  for (const Tensor& t : tensors) values.emplace_back(t, t.to_vector());
  start_values_ = std::move(values);
  return true;
}

void ModelAverager::take_start_values(const std::vector<Tensor>& tensors) {
  if (start_values_.empty()) return;
  std::vector<float> start;
  start.reserve(x_.size());
  for (const Tensor& t : tensors) {
    const auto it = std::find_if(start_values_.begin(), start_values_.end(), [&](const auto& e) {
      return e.first.impl() == t.impl();
    });
    if (it == start_values_.end() || static_cast<int64_t>(it->second.size()) != t.numel()) {
      start_values_.clear();  // not what start_from saw: no anchors from it
      return;
    }
    start.insert(start.end(), it->second.begin(), it->second.end());
  }
  start_values_.clear();
  for (size_t l = 0; l < levels_.size(); ++l) {
    if (!takes_start(level_options_[l])) continue;
    for (size_t f = 0; f < levels_[l].size(); ++f) {
      detail::AveragingLevel& unit = *levels_[l][f];
      if (unit.group() == nullptr || unit.has_anchor() || unit.pending()) continue;
      const detail::Fragment p = part(l, f);
      unit.reset_anchor(std::span<const float>(start).subspan(static_cast<size_t>(p.offset),
                                                              static_cast<size_t>(p.size)));
    }
  }
}

void ModelAverager::check_tensors_once(const std::vector<Tensor>& params) {
  if (tensors_checked_) return;
  const std::vector<Tensor> to_average = get_params_to_average(params);
  std::vector<detail::TensorEntry> entries = detail::describe_tensors(to_average, "parameter");
  const auto buffers = detail::describe_tensors(options_.average_buffers, "buffer");
  entries.insert(entries.end(), buffers.begin(), buffers.end());
  detail::check_same_tensors(*pg_, class_name_, entries,
                             "what to average (parameters with a gradient, then buffers)");
  tensors_checked_ = true;
}

void ModelAverager::average_step(int level, const std::vector<Tensor>& params) {
  check_tensors_once(params);
  // The units starting at this step, lowest level first, fragments in order.
  std::vector<std::pair<size_t, size_t>> starts;
  for (size_t l = 0; l < levels_.size(); ++l) {
    const auto fragments = static_cast<int64_t>(levels_[l].size());
    for (int64_t f = 0; f < fragments; ++f) {
      const int64_t offset = detail::fragment_offset(level_options_[l].period, fragments, f);
      const bool starts_now =
          offset == 0 ? static_cast<int>(l) == level : fragment_starts(l, offset, step_);
      if (starts_now) starts.emplace_back(l, static_cast<size_t>(f));
    }
  }
  bool due = false, settle = false, anchored_below = false;
  for (size_t l = 0; l < levels_.size(); ++l) {
    for (size_t f = 0; f < levels_[l].size(); ++f) {
      const detail::AveragingLevel& unit = *levels_[l][f];
      if (!unit.pending()) continue;
      due |= unit.due_step() <= step_;
      for (const auto& [top, g] : starts) settle |= l < top || (l == top && f == g);
    }
  }
  for (const auto& [top, g] : starts) {
    for (size_t l = 0; l < top; ++l) anchored_below |= is_anchored(level_options_[l]);
  }
  const bool plain =
      starts.empty() || (starts.size() == 1 && levels_[starts[0].first].size() == 1 &&
                         levels_[starts[0].first][0]->plain());
  if (!due && !settle && !anchored_below && plain) {
    // Plain averaging, exactly as torch's (and hsgd's before level options).
    if (level >= 0) {
      average_at_level(static_cast<size_t>(level), params, levels_[level][0]->group());
    }
    return;
  }
  const std::vector<Tensor> tensors = pack(params);
  take_start_values(tensors);
  for (size_t l = 0; l < levels_.size(); ++l) {
    for (size_t f = 0; f < levels_[l].size(); ++f) {
      if (levels_[l][f]->pending() && levels_[l][f]->due_step() <= step_) complete_unit(l, f);
    }
  }
  for (const auto& [top, f] : starts) {
    for (size_t l = 0; l < top; ++l) {
      for (size_t g = 0; g < levels_[l].size(); ++g) {
        if (levels_[l][g]->pending()) complete_unit(l, g);
      }
    }
    detail::AveragingLevel& current = *levels_[top][f];
    if (current.pending()) complete_unit(top, f);
    if (levels_[top].size() == 1 && current.plain()) {
      unflatten_from(x_, tensors);
      average_at_level(top, params, current.group());
      flatten_into(tensors, x_);
      reset_anchors_below(top, x_, 0);
    } else if (current.group() != nullptr) {
      const auto start = std::chrono::steady_clock::now();
      const detail::Fragment p = part(top, f);
      stats_[top].calls += 1;
      stats_[top].bytes +=
          current.start(step_,
                        std::span<const float>(x_).subspan(static_cast<size_t>(p.offset),
                                                           static_cast<size_t>(p.size)),
                        p.n_params);
      if (current.group()->size() == pg_->size()) {
        if (levels_[top].size() == 1) {
          whole_group_start_step_ = step_;
        } else if (f == 0) {
          streaming_period_start_step_ = step_;
        }
      }
      const std::chrono::duration<double> spent = std::chrono::steady_clock::now() - start;
      stats_[top].seconds += spent.count();
      if (current.delay() == 0) complete_unit(top, f);
    }
  }
  unflatten_from(x_, tensors);
}

void ModelAverager::finish_pending(const std::vector<Tensor>& params) {
  if (!has_pending()) return;
  const std::vector<Tensor> tensors = pack(params);
  for (size_t l = 0; l < levels_.size(); ++l) {
    for (size_t f = 0; f < levels_[l].size(); ++f) {
      if (levels_[l][f]->pending()) complete_unit(l, f);
    }
  }
  unflatten_from(x_, tensors);
}

void ModelAverager::finish_pending(const std::vector<ParamGroup>& groups) {
  finish_pending(get_params_to_average(groups));
}

}  // namespace hsgd::distributed
