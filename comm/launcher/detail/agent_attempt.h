#pragma once
// LaunchAgent::Attempt: the state of one attempt on this node, shared by the agent's sources
// (agent.cpp starts an attempt, agent_monitor.cpp watches it). Internal to comm/launcher.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/launcher/agent.h"
#include "comm/launcher/hang_detector.h"
#include "comm/launcher/heartbeat.h"
#include "comm/launcher/node_rendezvous.h"
#include "comm/launcher/output_router.h"
#include "comm/launcher/worker_process.h"

namespace hsgd::comm::launcher {

struct LaunchAgent::Attempt {
  using Clock = std::chrono::steady_clock;

  int index = 0;
  std::string prefix;  // store keys of this attempt
  NodeAssignment nodes;
  std::unique_ptr<OutputRouter> output;
  std::vector<WorkerProcess> workers;  // by local rank
  std::unique_ptr<Heartbeat> heartbeat;
  std::unique_ptr<HangDetector> progress;

  // Monitoring (step 3-5): whether this node's "done" key is set, and when the store and the
  // workers' progress are due to be looked at next.
  bool local_done = false;
  Clock::time_point next_store_check{};
  Clock::time_point next_progress_check{};

  std::string failed_key() const { return prefix + "failed"; }
  std::string done_key(int node) const { return prefix + "done/" + std::to_string(node); }
};

}  // namespace hsgd::comm::launcher
