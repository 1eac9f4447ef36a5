#pragma once
// Heartbeat: how an agent notices that the agent of another node died (kill -9, machine lost)
// while the workers of the job are running, instead of waiting for the workers' collective
// timeout.
//
// Each agent writes its own counter "<prefix>heartbeat/<node>" every `interval` (set, with a
// count kept here: writing it again is harmless), and reads everyone's counters in the same
// round trip schedule. A node whose counter has not changed for `timeout` (measured on the
// reader's steady clock, so clocks of different machines never need to agree) is reported as
// silent. Silence is only counted while this agent could look: after a gap in its own reads
// longer than two intervals (the rendezvous server was away, so nobody could beat), every node
// gets a full `timeout` again from the first read after it. With self = -1 the Heartbeat only
// watches: it beats for no node and reads every node's counter (an agent waiting to join, see
// agent.h).
//
// Store errors propagate (hsgd::comm::ServerUnavailable while the server is away, inside a
// NoServerWait scope); the next tick() tries again.
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

  // Writes this node's next count now.
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
  Clock::time_point last_read_{};  // of the last tick that read every counter
  uint64_t beats_ = 0;             // this node's count
};

}  // namespace hsgd::comm::launcher
