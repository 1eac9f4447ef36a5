#pragma once
// ElasticWorld: a worker's view of an elastic job (hsgd-run --nnodes MIN:MAX). The agents decide
// which nodes form each generation (comm/elastic/membership.h); ElasticWorld turns the newest
// generation that holds this worker's node into a world ProcessGroup, and abandons it when a
// member is lost, so that training goes on in the next generation without restarting the
// process.
//
// advance() waits (bounded by join_timeout) for a generation newer than the current one that
// holds this node, announces this rank under the generation's prefix, waits for every member of
// that generation to announce itself too (switching to a newer generation when one appears
// meanwhile: a member died while the others gathered), then builds the world group with
// init_process_group under generation_prefix(g): rank = the node's rank offset + local rank,
// world size = the generation's. A generation whose members do not all arrive, or whose group
// fails to connect, is skipped: the agents announce the next one. When a generation
// failed and no newer one appears within reform_after (a collective failed though no member died,
// e.g. a timeout), its live members propose the same nodes again as the next generation.
// abandon() records a failed world in the store (failed_key: the agents then drop a member whose
// heartbeat went silent meanwhile), aborts the current
// world and every group made from it (ProcessGroup::abort: their collectives fail at once, here
// and on the peers), then releases them; the caller must release its own references (DDP,
// averagers) before the next advance() for their Gloo contexts to close. A world that has not
// failed (the ranks agreed to adopt a newer generation) is first left together
// (ProcessGroup::shutdown, bounded by leave_timeout): aborted at once, it could take the tail of
// the last collective from a slower member, whose collective would then fail.
//
// While a world is current, a watcher thread reads the newest generation every poll_interval x 4:
// when one appears that lacks a member of the current one (its agent found it dead, e.g. its
// host vanished), it aborts the current world, so that a collective waiting for that member
// fails at once instead of at the collective timeout. A generation that only adds nodes aborts
// nothing: the training loop adopts it at a step where all ranks agree to
// (newer_generation_announced).
//
// An ElasticWorld ignores SIGPIPE in its process: a survivor's write to a member that died fails
// the collective instead of killing the survivor.
//
// Shared memory between the ranks of a node is off in an elastic world: a group's node identity
// would have to follow the generations' node ranks. Collectives go over TCP.
//
// Usage (under hsgd-run --nnodes 1:2, which sets HSGD_ELASTIC_NODE_ID):
//   hsgd::comm::elastic::ElasticWorld
//   elastic(hsgd::comm::elastic::ElasticWorldOptions::from_env());
//   std::shared_ptr<hsgd::comm::ProcessGroup> world = elastic.advance();
//   // ... a collective of world throws hsgd::CommError: a member is gone ...
//   elastic.abandon();
//   world = elastic.advance();   // the next generation, with the survivors (and joiners)

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/elastic/membership.h"
#include "comm/process_group/init.h"
#include "comm/process_group/process_group.h"
#include "comm/store/store.h"

namespace hsgd::comm::elastic {

// The collective timeout of an elastic world when HSGD_TIMEOUT_MS is not set: below hsgd-run's
// default --heartbeat-timeout (30 s), so that a vanished host costs at most this long.
inline constexpr Duration kDefaultCollectiveTimeout = std::chrono::seconds(20);

struct ElasticWorldOptions {
  std::string node_id{};  // HSGD_ELASTIC_NODE_ID: this worker's node incarnation
  // The group template: master_addr/port, job id, token, socket interface, collective timeout,
  // mismatch check. rank, world size, node rank, key prefix and store are set per generation.
  InitOptions init{};
  std::shared_ptr<Store> store = nullptr;  // null: a TcpStore to init.master_addr:master_port
  // How long advance() waits for a generation that holds this node and forms.
  Duration join_timeout = std::chrono::seconds(300);
  Duration poll_interval = std::chrono::milliseconds(50);
  // After a failed generation, how long advance() waits for the agents to announce a change
  // before the members form the same nodes again as the next generation (see advance()).
  Duration reform_after = std::chrono::seconds(3);
  // How long abandon() waits for the other members to leave a world that has not failed.
  Duration leave_timeout = std::chrono::seconds(10);

  // InitOptions::from_env() for the template (HSGD_TIMEOUT_MS is the collective timeout: how
  // long a collective waits for a member whose host vanished; kDefaultCollectiveTimeout when
  // unset), HSGD_ELASTIC_NODE_ID, and
  // HSGD_ELASTIC_JOIN_TIMEOUT_MS. Throws hsgd::InvalidArgument naming a bad value.
  static ElasticWorldOptions from_env();
  // Whether this process runs under an elastic hsgd-run (HSGD_ELASTIC_NODE_ID is set).
  static bool enabled_in_env();
};

// advance() found that this node is no longer a member (its agent or another one declared it
// gone) and no newer generation will hold it.
class RemovedFromJob : public CommError {
 public:
  using CommError::CommError;
};

class ElasticWorld {
 public:
  explicit ElasticWorld(ElasticWorldOptions options);
  ~ElasticWorld();
  ElasticWorld(const ElasticWorld&) = delete;
  ElasticWorld& operator=(const ElasticWorld&) = delete;

  // Forms the next generation's world (see above) and returns it. Throws hsgd::Timeout after
  // join_timeout, RemovedFromJob when this node was declared gone.
  std::shared_ptr<ProcessGroup> advance();
  // Aborts and releases the current world (no-op without one); leaves it together with the
  // other members first when it has not failed (see above). Does not throw.
  void abandon();

  const std::shared_ptr<ProcessGroup>& world() const { return world_; }
  // The current generation (number -1 before the first advance()).
  const Generation& generation() const { return generation_; }
  // This node's local rank and its node's rank in the current generation.
  int local_rank() const { return options_.init.local_rank; }
  int node_rank() const { return generation_.node_rank(options_.node_id); }
  const std::string& node_id() const { return options_.node_id; }
  // Whether the store holds a generation newer than the current one (one store read; no
  // collective: ranks may see it at different moments, so agree collectively before acting).
  // False while the rendezvous server is away: training does not wait for it.
  bool newer_generation_announced();
  Store& store() { return *store_; }

 private:
  // Announces this rank in g and waits for the others; false when a newer generation that
  // holds this node appeared meanwhile (or the deadline passed).
  bool gather(const Generation& g, std::chrono::steady_clock::time_point deadline);

  void start_watcher();
  void stop_watcher();

  const ElasticWorldOptions options_;
  const std::shared_ptr<Store> store_;
  Generation generation_{.number = -1};
  std::shared_ptr<ProcessGroup> world_;
  // The watcher (see above): aborts `watched` when a generation drops one of its members.
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;
  std::thread watcher_;
};

}  // namespace hsgd::comm::elastic
