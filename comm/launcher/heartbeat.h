#pragma once
// Heartbeat: how an agent notices that the agent of another node died (kill -9, machine lost)
// while the workers of the job are running, instead of waiting for the workers' collective
// timeout.
//
// Each agent increments its own counter "<prefix>heartbeat/<node>" every `interval`, and reads
// everyone's counters in the same round trip schedule. A node whose counter has not changed for
// `timeout` (measured on the reader's steady clock, so clocks of different machines never need
// to agree) is reported as silent. With self = -1 the Heartbeat only watches: it beats for no
// node and reads every node's counter (an agent waiting to join, see agent.h).
//
// Usage:
//   using namespace std::chrono_literals;
//   const int nnodes = 2, my_node = 0;
//   Heartbeat hb(*store, "hsgd-run/attempt/0/", nnodes, my_node, 1s, 30s);
//   hb.beat(Heartbeat::Clock::now());                         // once, before workers start
//   if (int silent = hb.tick(Heartbeat::Clock::now()); silent >= 0) {
//     // node `silent` is gone
//   }

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/store/store.h"

namespace hsgd::comm::launcher {

class Heartbeat {
 public:
  using Clock = std::chrono::steady_clock;

  Heartbeat(Store& store, std::string prefix, int nnodes, int self,
            std::chrono::milliseconds interval, std::chrono::milliseconds timeout);

  // Increments this node's counter now.
  void beat(Clock::time_point now);

  // At most once per interval: beats and reads every counter. Returns the rank of a node whose
  // counter did not change for `timeout`, or -1. Never blocks longer than one store round trip.
  int tick(Clock::time_point now);

  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  std::string key(int node) const { return prefix_ + "heartbeat/" + std::to_string(node); }

  // Constant after construction.
  Store& store_;
  const std::string prefix_;
  const int nnodes_;
  const int self_;
  const std::chrono::milliseconds interval_;
  const std::chrono::milliseconds timeout_;
  // What we saw last, per node.
  std::vector<std::string> last_value_;
  std::vector<Clock::time_point> last_change_;
  Clock::time_point next_tick_{};
};

}  // namespace hsgd::comm::launcher
