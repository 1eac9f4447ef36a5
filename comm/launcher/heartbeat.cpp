#include "comm/launcher/heartbeat.h"

#include <algorithm>
#include <string>

#include "comm/error.h"

namespace hsgd::comm::launcher {

Heartbeat::Heartbeat(Store& store, std::string prefix, int nnodes, int self,
                     std::chrono::milliseconds interval, std::chrono::milliseconds timeout)
    : store_(store),
      prefix_(std::move(prefix)),
      nnodes_(nnodes),
      self_(self),
      interval_(interval),
      timeout_(timeout),
      last_value_(static_cast<size_t>(nnodes)),
      last_change_(static_cast<size_t>(nnodes), Clock::now()),
      last_read_(Clock::now()) {
  HSGD_CHECK(self >= -1 && self < nnodes, "Heartbeat: node ", self, " out of range for ", nnodes,
             " nodes (-1: watch only)");
  HSGD_CHECK(interval.count() > 0 && timeout > interval, "Heartbeat: timeout ", timeout.count(),
             " ms must exceed the interval ", interval.count(), " ms");
}

void Heartbeat::beat(Clock::time_point now) {
  next_tick_ = now + interval_;
  if (self_ >= 0) store_.set(key(self_), to_bytes(std::to_string(++beats_)));
}

int Heartbeat::tick(Clock::time_point now) {
  if (now < next_tick_) return -1;
  beat(now);
  if (nnodes_ == 1 && self_ == 0) return -1;
  std::vector<std::string> keys;
  std::vector<int> nodes;
  for (int n = 0; n < nnodes_; ++n) {
    if (n == self_) continue;
    keys.push_back(key(n));
    nodes.push_back(n);
  }
  // A node that has not beaten yet has no key: check() first, so that get never waits, and
  // one such node does not hide the beats of the others.
  std::vector<std::string> values(keys.size());
  if (store_.check(keys)) {
    const auto all = store_.multi_get(keys, interval_);
    for (size_t i = 0; i < keys.size(); ++i) values[i] = to_string(all[i]);
  } else {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (store_.check({keys[i]})) values[i] = to_string(store_.get(keys[i], interval_));
    }
  }
  // This agent could not look for a while: whatever it missed, nobody is blamed for it.
  if (now - last_read_ > 2 * interval_) {
    std::fill(last_change_.begin(), last_change_.end(), now);
  }
  last_read_ = now;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const size_t n = static_cast<size_t>(nodes[i]);
    std::string value = std::move(values[i]);
    if (value != last_value_[n]) {
      last_value_[n] = std::move(value);
      last_change_[n] = now;
    } else if (now - last_change_[n] > timeout_) {
      return nodes[i];
    }
  }
  return -1;
}

}  // namespace hsgd::comm::launcher
