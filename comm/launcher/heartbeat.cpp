#include "comm/launcher/heartbeat.h"

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
      last_change_(static_cast<size_t>(nnodes), Clock::now()) {
  HSGD_CHECK(self >= 0 && self < nnodes, "Heartbeat: node ", self, " out of range for ", nnodes,
             " nodes");
  HSGD_CHECK(interval.count() > 0 && timeout > interval, "Heartbeat: timeout ", timeout.count(),
             " ms must exceed the interval ", interval.count(), " ms");
}

void Heartbeat::beat(Clock::time_point now) {
  store_.add(key(self_), 1);
  next_tick_ = now + interval_;
}

int Heartbeat::tick(Clock::time_point now) {
  if (now < next_tick_) return -1;
  beat(now);
  if (nnodes_ == 1) return -1;
  std::vector<std::string> keys;
  std::vector<int> nodes;
  for (int n = 0; n < nnodes_; ++n) {
    if (n == self_) continue;
    keys.push_back(key(n));
    nodes.push_back(n);
  }
  // A node that has not beaten yet has no key: check() first, so multi_get never waits.
  std::vector<Bytes> values;
  if (store_.check(keys)) values = store_.multi_get(keys, interval_);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const size_t n = static_cast<size_t>(nodes[i]);
    std::string value = values.empty() ? std::string() : to_string(values[i]);
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
