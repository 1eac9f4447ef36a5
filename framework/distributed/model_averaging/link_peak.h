#pragma once
// LinkPeak: the busiest window of a link, from the transfers it carried. Each transfer is
// (start, end, bytes), its bytes spread uniformly over [start, end] (a transfer with end <=
// start counts whole at its start); the peak is the largest number of bytes that falls into any
// window of `window` seconds, divided by the window: a rate in bytes per second.
//
// The averagers keep one per level (AveragingLevelStats::peak_bytes_per_second, averagers.h),
// recording each collective of the level from the moment it was issued to the moment it
// finished: a collective queued behind another on the same group counts its queueing time as
// transfer time, which spreads its bytes thinner (the peak is then a lower bound).
//
// Exact: the bytes in a window [w, w + window] are piecewise linear in w, with breaks where w or
// w + window meets a transfer's start or end, so the maximum is at one of those w. add()
// examines the windows that meet the new transfer, against the transfers stored around it. It
// keeps the latest kKept to 2 kKept transfers (by start), so memory stays bounded over a long
// run; a transfer added after kKept later-starting ones meets only those.
//
// Usage:
//   detail::LinkPeak peak(0.1);               // the busiest 100 ms
//   peak.add(0.00, 0.20, 2'000'000);          // 2 MB over 200 ms: 1 MB in any 100 ms of it
//   peak.add(0.15, 0.15, 1'000'000);          // 1 MB at once
//   peak.bytes_per_second();                  // 2e7: [0.05, 0.15] or later holds 1 + 1 MB

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hsgd::distributed::detail {

class LinkPeak {
 public:
  explicit LinkPeak(double window_seconds = 0.1);

  // Records a transfer of `bytes` over [start, end] (seconds on any one clock, the same for
  // every call). bytes <= 0 is ignored.
  void add(double start, double end, int64_t bytes);
  // The peak so far, bytes per second (0 before any transfer).
  double bytes_per_second() const { return peak_bytes_ / window_; }
  // Keeps at least `bytes_per_second` as the peak (a value restored from a checkpoint, whose
  // transfers were on another process's clock).
  void keep_at_least(double bytes_per_second);
  double window_seconds() const { return window_; }

  static constexpr size_t kKept = 1024;

 private:
  struct Transfer {
    double start = 0;
    double end = 0;
    int64_t bytes = 0;
  };
  // The bytes of the stored transfers that fall into [w, w + window_].
  double bytes_in(double w) const;

  // Constant after construction.
  const double window_;

  std::vector<Transfer> transfers_;  // ordered by start
  double longest_ = 0;               // the longest transfer's duration
  double peak_bytes_ = 0;
  std::vector<double> candidates_;  // add()'s scratch, kept to allocate only while it grows
};

}  // namespace hsgd::distributed::detail
