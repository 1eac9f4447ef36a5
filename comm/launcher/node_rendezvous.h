#pragma once
// Node rendezvous: how the hsgd-run agents of one job (one per node) meet through a Store and
// agree on node ranks, before any worker starts.
//
// Protocol, for one attempt (all keys under options.key_prefix, which the caller makes unique per
// job and attempt):
//   1. slot = add("rdzv/arrivals", 1) - 1 gives the order of arrival; a slot >= nnodes means
//      more agents than nnodes joined and fails with RendezvousFull: a reused job id, or an
//      agent that comes back after the attempt was formed (LaunchAgent then waits for the
//      attempt to end and joins the next one, see agent.h).
//   2. set("rdzv/node/<slot>", this node's NodeInfo).
//   3. Poll until "rdzv/node/0" .. "rdzv/node/<nnodes-1>" all exist, or the timeout passes: then
//      hsgd::Timeout lists the nodes that joined and how many are missing. While the rendezvous
//      server is away (comm/store/store_outage.h) the poll goes on: a node that joins then
//      waits for the server, and the nodes' records are re-published by their stores.
//   4. Read every NodeInfo and run assign_node_ranks(): the same input gives every agent the same
//      table without further messages.
//
// Usage:
//   NodeAssignment a = rendezvous_nodes(*store, {.nnodes = 2, .job_id = "job42"},
//                                       NodeInfo{.host = "a", .pid = getpid(),
//                                                .local_world_size = 4});
//   // a.node_rank, a.rank_offset, a.world_size

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "comm/error.h"
#include "comm/launcher/launcher_names.h"
#include "comm/store/store.h"

namespace hsgd::comm::launcher {

// What one agent tells the others about its node.
struct NodeInfo {
  std::string host{};
  int pid = 0;               // of the agent: tells apart several agents on one host
  int local_world_size = 1;  // workers on this node (AgentOptions::nproc_per_node)
  int requested_rank = -1;   // AgentOptions::node_rank, or -1 for "by order of arrival"

  std::string encode() const;
  static NodeInfo decode(const std::string& text);  // throws hsgd::CommError on garbage
};

// The outcome of a rendezvous, identical on every node.
struct NodeAssignment {
  int node_rank = 0;
  int world_size = 0;             // sum of local_world_size over all nodes
  int rank_offset = 0;            // global rank of this node's local rank 0
  std::vector<NodeInfo> nodes{};  // indexed by node rank

  // A table "node-rank  host  pid  local-world-size  first-rank" for the log.
  std::string table() const;
};

// Thrown when the caller's interrupted() callback asked to stop waiting.
class RendezvousInterrupted : public Error {
 public:
  using Error::Error;
};

// Thrown when all nnodes places of the rendezvous were taken before this node arrived.
class RendezvousFull : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

struct NodeRendezvousOptions {
  int nnodes = 1;
  std::string job_id{};      // for messages
  std::string endpoint{};    // "host:port" of the store, for messages
  std::string key_prefix{};  // unique per job attempt
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  std::chrono::milliseconds poll_interval = std::chrono::milliseconds(50);
  std::function<bool()> interrupted{};  // polled while waiting; may be empty
  LauncherNames names{};                // how messages name the settings
};

// Runs the protocol above. Throws hsgd::Timeout (nodes missing), RendezvousFull (too many nodes),
// hsgd::InvalidArgument (conflicting or out-of-range requested ranks) or RendezvousInterrupted.
NodeAssignment rendezvous_nodes(Store& store, const NodeRendezvousOptions& options,
                                const NodeInfo& self);

// Deterministic rank assignment: nodes with a requested rank get it, the others take the free
// ranks in increasing order, in order of arrival. `by_arrival[self_slot]` is the calling node.
NodeAssignment assign_node_ranks(const std::vector<NodeInfo>& by_arrival, int self_slot,
                                 const LauncherNames& names = {});

}  // namespace hsgd::comm::launcher
