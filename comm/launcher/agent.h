#pragma once
// LaunchAgent: the per-node part of hsgd-run. It meets the agents of the other nodes through a
// Store, starts this node's workers, watches them, and stops / restarts the whole job together.
//
// One run() goes through attempts 0 .. max_restarts. Each attempt:
//   1. node rendezvous under the attempt's own key prefix (comm/launcher/node_rendezvous.h), and
//      logs the node table;
//   2. spawns nproc_per_node workers (each in its own process group, see worker_process.h) with
//      the torchrun variables (worker_env.h), HSGD_RESTART_COUNT = attempt;
//   3. monitors: forwards output (output_router.h), notices exits, and polls the attempt's
//      "failed" key every monitor_interval, so a failure on any node is seen by all agents;
//   4. when a local worker fails, publishes a FailureRecord (the first one wins: the root cause,
//      with exit status and last output lines), then on every node sends SIGTERM to all workers,
//      SIGKILL after grace_period, and reaps them;
//      It also beats its heartbeat and fails the attempt when another node's agent went silent
//      for heartbeat_timeout (killed, machine lost), and watches its workers' progress
//      (hang_detector.h): a worker stopped, or silent outside a collective while another
//      waits in one, for worker_timeout is named as the root cause and the attempt fails. When
//      a worker fails inside a collective while another is stopped or silent that way, the
//      silent one is named: the root cause is the rank that did not arrive;
//   5. when every local worker succeeded, sets "done/<node>" and waits for the other nodes' done
//      keys (still watching "failed": a late failure elsewhere restarts this node too).
// A restartable failure starts the next attempt on all nodes; after max_restarts the job fails.
// The attempts are the job's, not the agent's: every node of attempt N runs its workers with
// HSGD_RESTART_COUNT = N, and each agent records N in the store ("hsgd-run/current-attempt")
// once attempt N's rendezvous completed. An agent that starts while its job is running (its
// predecessor on this node was killed, kill -9 or machine lost, and it was started again with
// the same command) begins at the recorded attempt. When that attempt already has all nnodes
// nodes (the others have not left it yet), the agent does not join it: it waits until the
// attempt fails (a failure record appears) or one of its nodes sends no heartbeat for
// heartbeat_timeout (then it publishes that failure itself), and joins the next attempt with the
// others; the restart counts against max_restarts as any other. If every node of that attempt
// keeps beating for heartbeat_timeout, this agent is one node too many (another job uses the
// same run_id) and run() throws RendezvousFull, as it does when the job already finished.
// Steps lost to restarts: the highest step a local worker reported before a failure minus the
// step the next attempt resumed from (its workers' first report), summed; printed at the end.
//
// Contract:
// - run() returns the exit code for hsgd-run: 0 only if every worker of the last attempt on every
//   node exited 0; kExitWillRepeat (78) when a worker on any node exited 78 (the job stops at
//   once, without spending restarts); kExitPreempted (75) when the job stopped (a signal to an
//   agent, or a worker exiting 75) and every local worker then exited 75 or 0, at least one 75 (it
//   wrote a checkpoint; comm/launcher/exit_codes.h); else 128 + signal if it was interrupted by
//   request_stop(), and 1 if the job failed. It throws hsgd::Timeout / hsgd::InvalidArgument from
//   the rendezvous and hsgd::CommError if the store fails. Whatever way run() ends, no worker
//   process is left running.
// - request_stop(sig) may be called from any thread or a signal handler: sig is forwarded to the
//   workers (SIGKILL after the grace period; a second request skips the grace period when it is
//   SIGINT, not when a scheduler repeats SIGTERM or SIGUSR1 while the workers write a checkpoint)
//   and the other nodes are told to stop (their workers get SIGTERM). A worker that handles
//   SIGUSR1 / SIGTERM as a preemption (framework/runtime/preemption.h) writes a checkpoint at its
//   next step boundary and exits kExitPreempted, and run() returns kExitPreempted.
// - Call run() from a thread that outlives it (workers die with the thread that forked them).
//
// Usage:
//   LaunchAgent agent(AgentOptions{.nproc_per_node = 4, .master_port = 29500,
//                                  .program = {"./train"}}, store);
//   int code = agent.run();

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/launcher/failure_record.h"
#include "comm/launcher/launcher_names.h"
#include "comm/launcher/node_rendezvous.h"
#include "comm/launcher/output_router.h"
#include "comm/launcher/worker_group.h"
#include "comm/store/store.h"

namespace hsgd::comm::launcher {

struct AgentOptions {
  int nnodes = 1;
  int nproc_per_node = 1;
  int node_rank = -1;  // -1: by order of arrival
  std::string run_id = "default";
  int max_restarts = 0;
  std::chrono::milliseconds rdzv_timeout = std::chrono::seconds(300);
  std::chrono::milliseconds grace_period = std::chrono::seconds(10);
  std::chrono::milliseconds monitor_interval = std::chrono::milliseconds(100);
  // A node whose agent sent no heartbeat for this long is declared dead (see heartbeat.h).
  std::chrono::milliseconds heartbeat_timeout = std::chrono::seconds(30);
  // A local worker stopped, or silent outside a collective while another waits in one, for this
  // long is hung (see hang_detector.h); 0 turns the check off.
  std::chrono::milliseconds worker_timeout = std::chrono::seconds(120);
  // Elastic mode (ElasticAgent, elastic_agent.h; LaunchAgent ignores these three): the job runs
  // on min_nodes..max_nodes nodes, and its first generation waits last_call for more nodes once
  // min_nodes are there.
  int min_nodes = 1;
  int max_nodes = 1;
  std::chrono::milliseconds last_call = std::chrono::seconds(2);
  std::string master_addr = "127.0.0.1";  // the store, as workers must reach it
  int master_port = 0;
  std::string token{};                 // passed to workers as HSGD_RDZV_TOKEN
  std::string token_file{};            // passed to workers as HSGD_TOKEN_FILE
  bool insecure = false;               // passed to workers as HSGD_INSECURE=1
  std::string hostname{};              // for the node table; empty = gethostname()
  std::vector<std::string> program{};  // argv of the worker program
  OutputOptions output{};
  LauncherNames names{};  // how logs and errors name the agent and these settings
};

// The checks of the options every agent uses (nproc_per_node, max_restarts, the timeouts,
// program): hsgd::InvalidArgument naming the bad value.
void check_agent_options(const AgentOptions& options);

class LaunchAgent {
 public:
  // Validates the options (hsgd::InvalidArgument naming the bad value).
  LaunchAgent(AgentOptions options, std::shared_ptr<Store> store);
  ~LaunchAgent();
  LaunchAgent(const LaunchAgent&) = delete;
  LaunchAgent& operator=(const LaunchAgent&) = delete;

  int run();
  void request_stop(int sig);

  // The root cause of the last failed attempt, if any (for tests and the final report).
  const std::optional<FailureRecord>& last_failure() const { return last_failure_; }

 private:
  // kMissed: the attempt had all its nodes without this one and ended; join the next.
  enum class Outcome { kSucceeded, kFailed, kInterrupted, kMissed };
  struct Attempt;  // comm/launcher/detail/agent_attempt.h

  // agent.cpp: one attempt, steps 1 and 2.
  Outcome run_attempt(int attempt);
  void join_nodes(Attempt& a);  // step 1; throws RendezvousInterrupted on request_stop()
  // The attempt recorded in the store as the job's current one (0 when none is).
  int current_attempt();
  // Step 1 found the attempt full: waits (bounded by heartbeat_timeout) for it to fail and
  // returns kMissed (kInterrupted when the job was stopped); std::nullopt when every node of it
  // kept beating, i.e. this agent is not one of them.
  std::optional<Outcome> wait_out_full_attempt(Attempt& a);
  void spawn_workers(Attempt& a);
  // At the end of an attempt: adds the steps lost before it (resumed step, last step).
  void account_steps(Attempt& a);
  std::string steps_lost_text() const;

  // agent_monitor.cpp: steps 3-5, until success, failure or interrupt.
  Outcome monitor(Attempt& a);
  // request_stop() was called: forward the signal, tell the other nodes, reap.
  Outcome interrupt(Attempt& a);
  // Feeds the local workers' progress to the hang detector, at most every monitor_interval;
  // returns whether it did.
  bool sample_progress(Attempt& a);
  // Step 4's cause on this node: a local worker that failed (or the peer it waited for), or,
  // after a progress sample, one that hung. Sets all_succeeded when every local worker exited 0.
  std::optional<FailureRecord> find_local_failure(Attempt& a, bool sampled, bool& all_succeeded);
  FailureRecord describe_worker_failure(Attempt& a, int local_rank);
  // A hung local worker (hang_detector.h) as the root cause, if any.
  std::optional<FailureRecord> find_hung_worker(Attempt& a);
  // Step 3's causes elsewhere: the attempt's "failed" key, or a node silent for
  // heartbeat_timeout. Returns the attempt's outcome when it ended.
  std::optional<Outcome> check_other_nodes(Attempt& a);
  // Step 5.
  void mark_local_done(Attempt& a);
  bool all_nodes_done(Attempt& a);
  Outcome succeed(Attempt& a);
  // Publishes `cause` (the attempt's first record wins and becomes last_failure_), then stops.
  Outcome fail(Attempt& a, const FailureRecord& cause);
  // Stops this node's workers after last_failure_ ended the attempt; returns what it means.
  Outcome stop_after_failure(Attempt& a);
  FailureRecord publish_failure(Attempt& a, FailureRecord record);
  // SIGTERM (or the forwarded signal), SIGKILL after grace_period, reap.
  void stop_workers(Attempt& a, int sig);
  void signal_workers(Attempt& a, int sig);
  void wait_and_reap(Attempt& a, int sig);
  bool stop_requested() const { return stop_.requested(); }

  // Constant after construction.
  const AgentOptions options_;
  const std::shared_ptr<Store> store_;
  const std::string endpoint_;  // "host:port", for messages
  // Set by request_stop() from any thread.
  StopRequests stop_{"LaunchAgent"};
  // Used by the run() thread only.
  std::optional<FailureRecord> last_failure_;
  int64_t steps_lost_ = 0;
  int64_t step_before_restart_ = -1;  // last step of the failed attempt, until the next resumes
  bool any_step_ = false;
  bool local_preempted_ = false;  // the last attempt's local workers all exited 75 (or 0)
};

}  // namespace hsgd::comm::launcher
