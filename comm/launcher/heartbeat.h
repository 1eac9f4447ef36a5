#pragma once
// Heartbeat: how an agent notices that the agent of another node died (kill -9, machine lost)
// while the workers of the job are running, instead of waiting for the workers' collective
// timeout.
//
// Each agent writes its own counter "<prefix>heartbeat/<member>" every `interval` (set, with a
// count kept here: writing it again is harmless), and reads everyone's counters in the same
// round trip schedule. A member whose counter has not changed for `timeout` (measured on the
// reader's steady clock, so clocks of different machines never need to agree) is reported as
// silent. Silence is only counted while this agent could look: after a gap in its own reads
// longer than two intervals (the rendezvous server was away, so nobody could beat), every member
// gets a full `timeout` again from the first read after it.
//
// Two spellings of one protocol:
// - HeartbeatBoard names members by string ids (elastic node incarnations, elastic_agent.h); the
//   set of watched ids may change from one tick to the next, and an id watched for the first time
//   gets a full `timeout` from then. An empty self only watches.
// - Heartbeat names the nnodes nodes of an attempt by node rank ("<prefix>heartbeat/<rank>").
//   With self = -1 it only watches: it beats for no node and reads every node's counter (an
//   agent waiting to join, see agent.h).
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
//   HeartbeatBoard board(*store, "hsgd-run/elastic/", "a-17-0", 1s, 30s);
//   board.beat(HeartbeatBoard::Clock::now());
//   for (const std::string& id : board.tick(HeartbeatBoard::Clock::now(), {"a-17-0", "b-9-0"})) {
//     // incarnation `id` is gone
//   }

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "comm/store/store.h"

namespace hsgd::comm::launcher {

class HeartbeatBoard {
 public:
  using Clock = std::chrono::steady_clock;

  HeartbeatBoard(Store& store, std::string prefix, std::string self,
                 std::chrono::milliseconds interval, std::chrono::milliseconds timeout);

  // Writes this member's next count now (nothing when self is empty).
  void beat(Clock::time_point now);

  // Starts watching id as if it had changed at `now` (tick() does so for ids it never saw).
  void watch(const std::string& id, Clock::time_point now);

  // At most once per interval: beats and reads the counters of `ids` (self is skipped). Returns
  // the ids whose counter did not change for `timeout`, in the order of `ids`; empty when not due.
  // Never blocks longer than one store round trip.
  std::vector<std::string> tick(Clock::time_point now, const std::vector<std::string>& ids);

  // How long id's counter has not changed, as of the last tick() that read it: zero for an id
  // never watched, and while this agent has not read the counters for two intervals (the
  // rendezvous server is away); a tick after such a gap restarts every member's count.
  std::chrono::milliseconds silent_for(const std::string& id, Clock::time_point now) const;

  std::chrono::milliseconds timeout() const { return timeout_; }
  std::chrono::milliseconds interval() const { return interval_; }

 private:
  std::string key(const std::string& id) const { return prefix_ + "heartbeat/" + id; }

  struct Seen {
    std::string value;
    Clock::time_point last_change;
  };

  // Constant after construction.
  Store& store_;
  const std::string prefix_;
  const std::string self_;
  const std::chrono::milliseconds interval_;
  const std::chrono::milliseconds timeout_;
  // What we saw last, per id.
  std::map<std::string, Seen> seen_;
  Clock::time_point next_tick_{};
  Clock::time_point last_read_{};  // of the last tick that read the counters
  uint64_t beats_ = 0;             // this member's count
};

class Heartbeat {
 public:
  using Clock = HeartbeatBoard::Clock;

  Heartbeat(Store& store, std::string prefix, int nnodes, int self,
            std::chrono::milliseconds interval, std::chrono::milliseconds timeout);

  // Writes this node's next count now.
  void beat(Clock::time_point now) { board_.beat(now); }

  // At most once per interval: beats and reads every counter. Returns the rank of a node whose
  // counter did not change for `timeout`, or -1. Never blocks longer than one store round trip.
  int tick(Clock::time_point now);

  std::chrono::milliseconds timeout() const { return board_.timeout(); }

 private:
  HeartbeatBoard board_;
  std::vector<std::string> ids_;  // "0" .. "nnodes-1"
};

}  // namespace hsgd::comm::launcher
