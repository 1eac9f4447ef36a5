#pragma once
// ElasticAgent: the per-node part of an elastic hsgd-run job (--nnodes MIN:MAX). The node is the
// unit of membership: the job runs in generations, each an ordered list of node incarnations
// (comm/elastic/membership.h), and a failed node leaves and comes back as a new incarnation while
// the other nodes' workers keep running.
//
// One run():
//   1. Registration: the incarnation id is "<host>-<agent pid>-<incarnation>" (incarnation 0, 1,
//      ... per rejoin of this agent). The agent registers it (register_node), beats its heartbeat
//      and spawns its nproc_per_node workers at once; they wait themselves, in the store, for a
//      generation that contains their node id. Worker variables: those of build_worker_env
//      (worker_env.h) with HSGD_RESTART_COUNT = incarnation, plus HSGD_ELASTIC_NODE_ID,
//      HSGD_ELASTIC_MIN_NODES, HSGD_ELASTIC_MAX_NODES, HSGD_ELASTIC_HEARTBEAT_MS (heartbeat_timeout
//      in ms). RANK, WORLD_SIZE, GROUP_RANK and GROUP_WORLD_SIZE are this node's values in the
//      newest generation that contains it when one exists at spawn time, else RANK = LOCAL_RANK,
//      WORLD_SIZE = LOCAL_WORLD_SIZE, GROUP_RANK = 0, GROUP_WORLD_SIZE = 1: elastic workers take
//      their ranks from the generation they join, never from these variables. Output lines and
//      log files (<log_dir>/attempt_<incarnation>/rank_<N>.log) carry that RANK.
//   2. Heartbeats: every alive incarnation beats "hsgd-run/elastic/heartbeat/<id>" (HeartbeatBoard,
//      heartbeat.h). An incarnation is alive iff registered, not left and its counter changed
//      within heartbeat_timeout on the reader's clock (a registration first seen gets a full
//      timeout). An agent that finds another incarnation silent sets its left key and logs it.
//      Faster for a process that is gone: each incarnation's alive key (membership.h) is owned
//      by its agent's store client, and the rendezvous server deletes it alive_linger() after
//      that agent's connections closed (clamp(heartbeat_timeout / 10, 0.1 s, 1 s)); an agent
//      that finds it gone sets the left key the same way. A host that vanishes closes nothing:
//      the heartbeat finds it, or sooner the workers: when a world's collective failed
//      (elastic/membership.h, failed_key), a member of it whose heartbeat has been silent for
//      half the collectives' timeout (at least 3 heartbeat intervals) is gone at once.
//   3. Generations, every monitor_interval, while the finished key is unset: the agent proposes
//      what GenerationPlanner (elastic_generations.h) plans from the alive registrations; any
//      agent may propose and the store keeps the first proposal of each number. While fewer than
//      min_nodes are alive nothing is proposed; after rdzv_timeout of that the job fails here:
//      the agent stops its workers, leaves, and run() returns 1 naming how many nodes are alive.
//   4. A local worker that exits non-zero or is killed by a signal: the agent logs the failure
//      record, stops the node's other workers (SIGTERM, SIGKILL after grace_period, reap), sets
//      left/<id> and proposes the generation without it. With restarts left (max_restarts counts
//      this node's rejoins) it registers incarnation + 1 and spawns new workers, which join;
//      else run() returns 1 and the other nodes go on. A worker exiting kExitPreempted (75) or
//      kExitWillRepeat (78) stops the node without a restart and run() returns that code.
//   5. When every local worker exited 0 the agent sets the finished key and run() returns 0. An
//      agent whose workers still run when the finished key appears waits heartbeat_timeout +
//      grace_period for them, then stops them: run() returns 0 when this node is not in the
//      newest generation (the job finished without it), else 1.
//   6. request_stop(sig): sig is forwarded to the workers, the agent sets left/<id>, reaps, and
//      run() returns kExitPreempted (75) when the local workers exited 75 (or 0, at least one 75),
//      else 128 + sig.
// The agent logs one line per generation it adopts ("generation G: N nodes, W workers: ...") and
// one per node that left or joined; its last line gives run()'s exit code, the job's
// generations, the node incarnations that left, this node's restarts and the worker-steps of
// training thrown away. A local worker hung for worker_timeout (hang_detector.h: stopped, or
// silent outside a collective while another local worker waits in one) fails the node like a
// worker that exited: its workers are stopped (the hung one with SIGKILL), the incarnation leaves,
// and the next one joins (0 turns the check off).
//
// Contract: every wait is bounded; store errors propagate from run() as hsgd::CommError (then no
// left key is written: the others find this node's heartbeat silent). Whatever way run() ends, no
// worker process is left running. Call run() from a thread that outlives it.
//
// Usage:
//   ElasticAgent agent(AgentOptions{.nproc_per_node = 4, .min_nodes = 1, .max_nodes = 4,
//                                   .master_port = 29500, .program = {"./train"}},
//                      store);
//   int code = agent.run();

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/elastic/membership.h"
#include "comm/launcher/agent.h"
#include "comm/launcher/elastic_generations.h"
#include "comm/launcher/worker_group.h"

namespace hsgd::comm::launcher {

class ElasticAgent {
 public:
  // Validates the options (hsgd::InvalidArgument naming the bad value); nnodes and node_rank are
  // not used.
  ElasticAgent(AgentOptions options, std::shared_ptr<Store> store);
  ~ElasticAgent();
  ElasticAgent(const ElasticAgent&) = delete;
  ElasticAgent& operator=(const ElasticAgent&) = delete;

  int run();
  // May be called from any thread or a signal handler.
  void request_stop(int sig);

  // Why this node stopped last (a local worker's failure, or the job's), if it did.
  const std::optional<FailureRecord>& last_failure() const { return last_failure_; }

 private:
  enum class Outcome { kSucceeded, kFailed, kInterrupted, kJobFailed };
  struct Incarnation;  // defined in elastic_agent.cpp

  void start(Incarnation& inc);
  Outcome monitor(Incarnation& inc);
  // Step 2 and 3, every monitor_interval: returns the outcome when the node is done.
  std::optional<Outcome> observe_membership(Incarnation& inc);
  // The members of the newest generation that are silent since a collective of theirs failed:
  // once the workers reported a failed world (failed_key) among the same nodes, a member whose
  // heartbeat has not changed for half the collectives' wait (at least 3 heartbeat intervals, at
  // most heartbeat_timeout) is gone, so that a lost host costs the collective timeout or the
  // heartbeat timeout, whichever is shorter.
  std::vector<std::string> silent_after_failure(Incarnation& inc,
                                                const std::optional<elastic::Generation>& latest,
                                                std::chrono::steady_clock::time_point now);
  std::optional<Outcome> wait_after_finish(Incarnation& inc,
                                           const std::optional<elastic::Generation>& latest);
  Outcome fail_locally(Incarnation& inc, int local_rank);
  // Every monitor_interval: a worker hung for options_.worker_timeout (hang_detector.h) makes
  // the node fail as fail_locally does (its workers are killed); nullopt otherwise.
  std::optional<Outcome> check_hang(Incarnation& inc);
  Outcome interrupt(Incarnation& inc);
  // Records that this node left (left/<id>); with propose_without, also proposes the latest
  // generation without it (when that keeps MIN nodes), so that the others need not wait for its
  // heartbeat.
  void leave(Incarnation& inc, bool propose_without = true);
  // The final line: exit code, generations, node incarnations that left, this node's restarts
  // and the worker-steps thrown away (membership.h's counter).
  void report_end(int code, int restarts);
  // How long this agent's alive key outlives its store connections (membership.h).
  std::chrono::milliseconds alive_linger() const;
  void stop_workers(Incarnation& inc, int sig);
  void log_generation(const elastic::Generation& g, const std::string& self_id);
  int run_outcome(int incarnation, Outcome outcome, bool& restart);
  bool stop_requested() const { return stop_.requested(); }

  // Constant after construction.
  const AgentOptions options_;
  const std::shared_ptr<Store> store_;
  const std::string host_;
  // Set by request_stop() from any thread.
  StopRequests stop_{"ElasticAgent"};
  // Used by the run() thread only.
  GenerationPlanner planner_;
  std::optional<FailureRecord> last_failure_;
  std::optional<elastic::Generation> adopted_;  // the newest generation logged
  bool local_preempted_ = false;
};

}  // namespace hsgd::comm::launcher
