#include "framework/distributed/model_averaging/link_peak.h"

#include <algorithm>

#include "comm/error.h"

namespace hsgd::distributed::detail {

LinkPeak::LinkPeak(double window_seconds) : window_(window_seconds) {
  HSGD_CHECK(window_seconds > 0, "LinkPeak: the window must be > 0 seconds, got ", window_seconds);
}

void LinkPeak::add(double start, double end, int64_t bytes) {
  if (bytes <= 0) return;
  end = std::max(start, end);
  const Transfer transfer{.start = start, .end = end, .bytes = bytes};
  const auto at = std::upper_bound(transfers_.begin(), transfers_.end(), start,
                                   [](double s, const Transfer& t) { return s < t.start; });
  transfers_.insert(at, transfer);
  longest_ = std::max(longest_, end - start);
  // The windows that meet the new transfer: w in [start - window, end]. Candidates are the
  // breaks of every transfer that may fall into that range.
  const double low = start - window_;
  const double high = end;
  std::vector<double>& candidates = candidates_;
  candidates.clear();
  const auto first =
      std::lower_bound(transfers_.begin(), transfers_.end(), low - longest_ - window_,
                       [](const Transfer& t, double s) { return t.start < s; });
  for (auto it = first; it != transfers_.end() && it->start <= high + window_; ++it) {
    for (const double w : {it->start, it->end, it->start - window_, it->end - window_}) {
      if (w >= low && w <= high) candidates.push_back(w);
    }
  }
  for (const double w : candidates) peak_bytes_ = std::max(peak_bytes_, bytes_in(w));
  if (transfers_.size() > 2 * kKept) {
    transfers_.erase(transfers_.begin(), transfers_.end() - static_cast<std::ptrdiff_t>(kKept));
    longest_ = 0;
    for (const Transfer& t : transfers_) longest_ = std::max(longest_, t.end - t.start);
  }
}

void LinkPeak::keep_at_least(double bytes_per_second) {
  peak_bytes_ = std::max(peak_bytes_, bytes_per_second * window_);
}

double LinkPeak::bytes_in(double w) const {
  const double w_end = w + window_;
  double sum = 0;
  const auto first = std::lower_bound(transfers_.begin(), transfers_.end(), w - longest_,
                                      [](const Transfer& t, double s) { return t.start < s; });
  for (auto it = first; it != transfers_.end() && it->start <= w_end; ++it) {
    const double duration = it->end - it->start;
    if (duration <= 0) {
      if (it->start >= w && it->start <= w_end) sum += static_cast<double>(it->bytes);
      continue;
    }
    const double overlap = std::min(it->end, w_end) - std::max(it->start, w);
    if (overlap > 0) sum += static_cast<double>(it->bytes) * overlap / duration;
  }
  return sum;
}

}  // namespace hsgd::distributed::detail
