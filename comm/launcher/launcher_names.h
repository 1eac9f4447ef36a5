#pragma once
// LauncherNames: how the launcher's messages (logs, errors, failure records) name the agent and
// the settings a user controls. The defaults are this library's own names, the fields of
// AgentOptions; a program built on the launcher passes the spelling its users know (hsgd-run:
// its own name and its flags, "--max-restarts").
//
// Usage:
//   LauncherNames names{.agent = "my-launcher", .max_restarts = "--restarts"};
//   AgentOptions options{.program = {"./train"}, .names = names};

#include <string>

namespace hsgd::comm::launcher {

struct LauncherNames {
  // Who speaks: the prefix of log lines ("<agent>: job ..."), "<agent> pid 42" in node tables.
  std::string agent = "launch agent";
  std::string nnodes = "AgentOptions::nnodes";
  std::string node_rank = "AgentOptions::node_rank";
  std::string run_id = "AgentOptions::run_id";
  std::string endpoint = "AgentOptions::master_addr/master_port";
  std::string max_restarts = "AgentOptions::max_restarts";
  std::string rdzv_timeout = "AgentOptions::rdzv_timeout";
  std::string heartbeat_timeout = "AgentOptions::heartbeat_timeout";
  std::string worker_timeout = "AgentOptions::worker_timeout";
  std::string node_range = "AgentOptions::min_nodes/max_nodes";
  std::string last_call = "AgentOptions::last_call";
};

}  // namespace hsgd::comm::launcher
