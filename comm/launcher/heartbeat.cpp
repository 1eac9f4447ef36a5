#include "comm/launcher/heartbeat.h"

#include <string>

#include "comm/error.h"

namespace hsgd::comm::launcher {

HeartbeatBoard::HeartbeatBoard(Store& store, std::string prefix, std::string self,
                               std::chrono::milliseconds interval,
                               std::chrono::milliseconds timeout)
    : store_(store),
      prefix_(std::move(prefix)),
      self_(std::move(self)),
      interval_(interval),
      timeout_(timeout),
      last_read_(Clock::now()) {
  HSGD_CHECK(interval.count() > 0 && timeout > interval, "Heartbeat: timeout ", timeout.count(),
             " ms must exceed the interval ", interval.count(), " ms");
}

void HeartbeatBoard::beat(Clock::time_point now) {
  next_tick_ = now + interval_;
  if (!self_.empty()) store_.set(key(self_), to_bytes(std::to_string(++beats_)));
}

void HeartbeatBoard::watch(const std::string& id, Clock::time_point now) {
  seen_.try_emplace(id, Seen{.value = "", .last_change = now});
}

std::vector<std::string> HeartbeatBoard::tick(Clock::time_point now,
                                              const std::vector<std::string>& ids) {
  if (now < next_tick_) return {};
  beat(now);
  std::vector<std::string> keys;
  std::vector<std::string> others;
  for (const std::string& id : ids) {
    if (id == self_) continue;
    keys.push_back(key(id));
    others.push_back(id);
  }
  if (others.empty()) return {};
  // A member that has not beaten yet has no key: check() first, so that get never waits, and
  // one such member does not hide the beats of the others.
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
    for (auto& [id, seen] : seen_) seen.last_change = now;
  }
  last_read_ = now;
  std::vector<std::string> silent;
  for (size_t i = 0; i < others.size(); ++i) {
    watch(others[i], now);
    Seen& seen = seen_.at(others[i]);
    if (values[i] != seen.value) {
      seen.value = std::move(values[i]);
      seen.last_change = now;
    } else if (now - seen.last_change > timeout_) {
      silent.push_back(others[i]);
    }
  }
  return silent;
}

std::chrono::milliseconds HeartbeatBoard::silent_for(const std::string& id,
                                                     Clock::time_point now) const {
  const auto it = seen_.find(id);
  // Nobody is blamed for the time this agent could not look (as in tick()).
  if (it == seen_.end() || now < it->second.last_change || now - last_read_ > 2 * interval_) {
    return std::chrono::milliseconds(0);
  }
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second.last_change);
}

Heartbeat::Heartbeat(Store& store, std::string prefix, int nnodes, int self,
                     std::chrono::milliseconds interval, std::chrono::milliseconds timeout)
    : board_(store, std::move(prefix), self >= 0 ? std::to_string(self) : std::string(), interval,
             timeout) {
  HSGD_CHECK(self >= -1 && self < nnodes, "Heartbeat: node ", self, " out of range for ", nnodes,
             " nodes (-1: watch only)");
  const auto now = Clock::now();
  for (int n = 0; n < nnodes; ++n) {
    ids_.push_back(std::to_string(n));
    board_.watch(ids_.back(), now);
  }
}

int Heartbeat::tick(Clock::time_point now) {
  const std::vector<std::string> silent = board_.tick(now, ids_);
  return silent.empty() ? -1 : std::stoi(silent.front());
}

}  // namespace hsgd::comm::launcher
