#include "comm/launcher/node_rendezvous.h"

#include <iomanip>
#include <sstream>
#include <thread>

#include "comm/store/store_outage.h"

namespace hsgd::comm::launcher {
namespace {

std::string node_key(const std::string& prefix, int slot) {
  return prefix + "rdzv/node/" + std::to_string(slot);
}

std::string describe(const NodeInfo& n, const LauncherNames& names) {
  std::ostringstream out;
  out << n.host << " (pid " << n.pid << ", " << n.local_world_size << " workers";
  if (n.requested_rank >= 0) out << ", " << names.node_rank << " " << n.requested_rank;
  out << ")";
  return out.str();
}

}  // namespace

std::string NodeInfo::encode() const {
  std::ostringstream out;
  out << host << '\n' << pid << '\n' << local_world_size << '\n' << requested_rank;
  return out.str();
}

NodeInfo NodeInfo::decode(const std::string& text) {
  std::istringstream in(text);
  NodeInfo n;
  std::string pid, lws, rank;
  if (!std::getline(in, n.host) || !std::getline(in, pid) || !std::getline(in, lws) ||
      !std::getline(in, rank)) {
    HSGD_THROW(CommError, "node rendezvous: malformed node record '", text, "'");
  }
  try {
    n.pid = std::stoi(pid);
    n.local_world_size = std::stoi(lws);
    n.requested_rank = std::stoi(rank);
  } catch (const std::exception&) {
    HSGD_THROW(CommError, "node rendezvous: malformed node record '", text, "'");
  }
  return n;
}

std::string NodeAssignment::table() const {
  std::ostringstream out;
  out << std::left << std::setw(11) << "node-rank" << std::setw(24) << "host" << std::setw(10)
      << "pid" << std::setw(18) << "local-world-size"
      << "ranks";
  int first = 0;
  for (size_t r = 0; r < nodes.size(); ++r) {
    const auto& n = nodes[r];
    out << '\n'
        << std::setw(11) << r << std::setw(24) << n.host << std::setw(10) << n.pid << std::setw(18)
        << n.local_world_size << first << ".." << first + n.local_world_size - 1;
    first += n.local_world_size;
  }
  return out.str();
}

NodeAssignment assign_node_ranks(const std::vector<NodeInfo>& by_arrival, int self_slot,
                                 const LauncherNames& names) {
  const int nnodes = static_cast<int>(by_arrival.size());
  HSGD_CHECK(self_slot >= 0 && self_slot < nnodes, "assign_node_ranks: slot ", self_slot,
             " out of range for ", nnodes, " nodes");
  std::vector<int> rank_of(nnodes, -1);
  std::vector<int> owner(nnodes, -1);  // node rank -> slot
  for (int slot = 0; slot < nnodes; ++slot) {
    const NodeInfo& n = by_arrival[slot];
    HSGD_CHECK(n.local_world_size > 0, "node rendezvous: node ", describe(n, names),
               " has local world size ", n.local_world_size, ", expected > 0");
    const int want = n.requested_rank;
    if (want < 0) continue;
    HSGD_CHECK(want < nnodes, "node rendezvous: node ", describe(n, names), " asked for ",
               names.node_rank, " ", want, ", expected a value in [0, ", nnodes, ") for ",
               names.nnodes, " ", nnodes);
    HSGD_CHECK(owner[want] < 0, "node rendezvous: nodes ", describe(by_arrival[owner[want]], names),
               " and ", describe(n, names), " both asked for ", names.node_rank, " ", want);
    owner[want] = slot;
    rank_of[slot] = want;
  }
  int next_free = 0;
  for (int slot = 0; slot < nnodes; ++slot) {
    if (rank_of[slot] >= 0) continue;
    while (owner[next_free] >= 0) ++next_free;
    owner[next_free] = slot;
    rank_of[slot] = next_free;
  }

  NodeAssignment a;
  a.node_rank = rank_of[self_slot];
  for (int r = 0; r < nnodes; ++r) {
    const NodeInfo& n = by_arrival[owner[r]];
    if (r < a.node_rank) a.rank_offset += n.local_world_size;
    a.world_size += n.local_world_size;
    a.nodes.push_back(n);
  }
  return a;
}

NodeAssignment rendezvous_nodes(Store& store, const NodeRendezvousOptions& options,
                                const NodeInfo& self) {
  HSGD_CHECK_GT(options.nnodes, 0,
                "node rendezvous: NodeRendezvousOptions::nnodes must be positive");
  const std::string& prefix = options.key_prefix;
  const LauncherNames& names = options.names;

  // 1. Order of arrival.
  const int64_t slot = store.add(prefix + "rdzv/arrivals", 1) - 1;
  HSGD_CHECK_AS(RendezvousFull, slot < options.nnodes, "node rendezvous: job '", options.job_id,
                "' at ", options.endpoint, " already has ", options.nnodes, " nodes (",
                names.nnodes, " ", options.nnodes, "); this node (", describe(self, names),
                ") would be number ", slot + 1, ". Is another job using the same ", names.run_id,
                "?");
  // 2. Announce this node.
  store.set(node_key(prefix, static_cast<int>(slot)), to_bytes(self.encode()));

  // 3. Wait for all nodes, in short polls so that an interrupt is noticed quickly.
  std::vector<std::string> keys;
  for (int i = 0; i < options.nnodes; ++i) keys.push_back(node_key(prefix, i));
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  // The store does not wait for a rendezvous server that is away: this loop does, still
  // noticing an interrupt, until the deadline (or the store's own reconnect bound) passes.
  auto all_joined = [&] {
    try {
      const NoServerWait no_wait;
      return store.check(keys);
    } catch (const ServerUnavailable&) {
      return false;
    }
  };
  while (!all_joined()) {
    if (options.interrupted && options.interrupted()) {
      throw RendezvousInterrupted("node rendezvous: interrupted while waiting for nodes");
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      std::ostringstream joined;
      int count = 0;
      for (const auto& key : keys) {
        if (!store.check({key})) continue;
        joined << (count++ == 0 ? "" : ", ")
               << describe(NodeInfo::decode(to_string(store.get(key, options.poll_interval))),
                           names);
      }
      HSGD_THROW(Timeout, "node rendezvous: job '", options.job_id, "' at ", options.endpoint,
                 " timed out after ", std::chrono::duration<double>(options.timeout).count(),
                 " s (", names.rdzv_timeout, "): ", count, " of ", options.nnodes,
                 " nodes joined [", joined.str(), "], ", options.nnodes - count, " missing. Start ",
                 names.agent, " on the missing nodes with the same ", names.endpoint, " and ",
                 names.run_id, ", or raise ", names.rdzv_timeout, ".");
    }
    std::this_thread::sleep_for(options.poll_interval);
  }

  // 4. Everyone computes the same table from the same records.
  std::vector<NodeInfo> by_arrival;
  for (const auto& value : store.multi_get(keys, options.poll_interval * 20)) {
    by_arrival.push_back(NodeInfo::decode(to_string(value)));
  }
  return assign_node_ranks(by_arrival, static_cast<int>(slot), names);
}

}  // namespace hsgd::comm::launcher
