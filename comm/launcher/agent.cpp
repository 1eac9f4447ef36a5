#include "comm/launcher/agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "comm/error.h"
#include "comm/launcher/detail/agent_attempt.h"
#include "comm/launcher/exit_codes.h"
#include "comm/launcher/heartbeat.h"
#include "comm/launcher/worker_env.h"
#include "comm/launcher/worker_group.h"
#include "comm/log.h"

namespace hsgd::comm::launcher {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Where each agent records the attempt whose rendezvous it completed last (see agent.h).
const std::string kCurrentAttemptKey = "hsgd-run/current-attempt";

std::string attempt_prefix(int attempt) {
  return "hsgd-run/attempt/" + std::to_string(attempt) + "/";
}

}  // namespace

LaunchAgent::LaunchAgent(AgentOptions options, std::shared_ptr<Store> store)
    : options_(std::move(options)),
      store_(std::move(store)),
      endpoint_(options_.master_addr + ":" + std::to_string(options_.master_port)) {
  HSGD_CHECK(store_ != nullptr, "LaunchAgent: store must not be null");
  HSGD_CHECK(options_.nnodes >= 1, "AgentOptions::nnodes ", options_.nnodes, " must be >= 1");
  HSGD_CHECK(options_.node_rank >= -1 && options_.node_rank < options_.nnodes,
             "AgentOptions::node_rank ", options_.node_rank, " must be -1 or in [0, ",
             options_.nnodes, ") for AgentOptions::nnodes ", options_.nnodes);
  check_agent_options(options_);
}

void check_agent_options(const AgentOptions& options) {
  HSGD_CHECK(options.nproc_per_node >= 1, "AgentOptions::nproc_per_node ", options.nproc_per_node,
             " must be >= 1");
  HSGD_CHECK(options.max_restarts >= 0, "AgentOptions::max_restarts ", options.max_restarts,
             " must be >= 0");
  HSGD_CHECK(options.rdzv_timeout.count() > 0, "AgentOptions::rdzv_timeout ",
             options.rdzv_timeout.count(), " ms must be positive");
  HSGD_CHECK(options.heartbeat_timeout >= milliseconds(200), "AgentOptions::heartbeat_timeout ",
             options.heartbeat_timeout.count(), " ms must be at least 200 ms");
  HSGD_CHECK(options.worker_timeout.count() >= 0, "AgentOptions::worker_timeout ",
             options.worker_timeout.count(), " ms must not be negative");
  HSGD_CHECK(!options.program.empty(),
             "AgentOptions::program is empty; expected the worker's argv");
}

LaunchAgent::~LaunchAgent() = default;

void LaunchAgent::request_stop(int sig) { stop_.request(sig); }

int LaunchAgent::run() {
  // Resolve the program once up front: a typo fails here, before any rendezvous.
  (void)resolve_program(options_.program[0], [] {
    const char* path = std::getenv("PATH");
    return std::string(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  }());
  const LauncherNames& names = options_.names;
  const int first = current_attempt();
  if (first > 0) {
    logger()->info("{}: job '{}' is in attempt {}: this node joins it", names.agent,
                   options_.run_id, first);
  }
  for (int attempt = first; attempt <= options_.max_restarts; ++attempt) {
    const Outcome outcome = run_attempt(attempt);
    if (outcome == Outcome::kMissed) {
      logger()->warn("{}: job '{}' attempt {} ended without this node (root cause: {})",
                     names.agent, options_.run_id, attempt, last_failure_->message);
      continue;
    }
    if (outcome == Outcome::kSucceeded) {
      logger()->info(
          "{}: job '{}' finished: all workers of all nodes exited 0 after {} "
          "restart(s){}",
          names.agent, options_.run_id, attempt, steps_lost_text());
      return 0;
    }
    if (outcome == Outcome::kInterrupted) {
      if (last_failure_ && last_failure_->kind == FailureRecord::Kind::kWillRepeat) {
        logger()->error(
            "{}: job '{}' stopped without restarting ({} of {} {} left unused): a worker "
            "exited {}, a failure a restart would repeat. Root cause: {}",
            names.agent, options_.run_id, options_.max_restarts - attempt, options_.max_restarts,
            names.max_restarts, kExitWillRepeat, last_failure_->message);
        return kExitWillRepeat;
      }
      if (local_preempted_) {
        logger()->warn(
            "{}: job '{}' preempted in attempt {}: the workers of this node wrote a checkpoint "
            "and exited {}; not restarting, exiting {} (resume from the checkpoint)",
            names.agent, options_.run_id, attempt, kExitPreempted, kExitPreempted);
        return kExitPreempted;
      }
      const int sig = stop_.signal();
      if (sig != 0) return 128 + sig;
      logger()->error("{}: job '{}' stopped: {}", names.agent, options_.run_id,
                      last_failure_ ? last_failure_->message : "interrupted");
      return 1;
    }
    if (last_failure_->restartable() && attempt < options_.max_restarts) {
      logger()->error("{}: job '{}' attempt {} failed. Root cause: {}", names.agent,
                      options_.run_id, attempt, last_failure_->message);
      logger()->warn("{}: restarting all nodes: attempt {} of {} ({} {})", names.agent, attempt + 1,
                     options_.max_restarts + 1, names.max_restarts, options_.max_restarts);
      continue;
    }
    logger()->error("{}: job '{}' failed after {} restart(s) ({} {}){}. Root cause: {}",
                    names.agent, options_.run_id, attempt, names.max_restarts,
                    options_.max_restarts, steps_lost_text(), last_failure_->message);
    return 1;
  }
  // Only a missed last attempt gets here: the job has no attempt left to join.
  logger()->error("{}: job '{}' failed: its last attempt {} ({} {}) ended without this node",
                  names.agent, options_.run_id, options_.max_restarts, names.max_restarts,
                  options_.max_restarts);
  return 1;
}

int LaunchAgent::current_attempt() {
  if (!store_->check({kCurrentAttemptKey})) return 0;
  int attempt = 0;
  try {
    attempt = std::stoi(to_string(store_->get(kCurrentAttemptKey)));
  } catch (const std::exception&) {
    return 0;  // not written by an agent: start from the beginning
  }
  return std::clamp(attempt, 0, options_.max_restarts);
}

LaunchAgent::Outcome LaunchAgent::run_attempt(int attempt) {
  Attempt a;
  a.index = attempt;
  a.prefix = attempt_prefix(attempt);
  try {
    join_nodes(a);
  } catch (const RendezvousInterrupted&) {
    return Outcome::kInterrupted;
  } catch (const RendezvousFull&) {
    if (auto outcome = wait_out_full_attempt(a)) return *outcome;
    throw;
  }
  spawn_workers(a);
  const Outcome outcome = monitor(a);
  account_steps(a);
  local_preempted_ = workers_preempted(a.workers);
  return outcome;
}

void LaunchAgent::join_nodes(Attempt& a) {
  const NodeInfo self{.host = this_host(options_.hostname),
                      .pid = static_cast<int>(::getpid()),
                      .local_world_size = options_.nproc_per_node,
                      .requested_rank = options_.node_rank};
  a.nodes =
      rendezvous_nodes(*store_,
                       NodeRendezvousOptions{.nnodes = options_.nnodes,
                                             .job_id = options_.run_id,
                                             .endpoint = endpoint_,
                                             .key_prefix = a.prefix,
                                             .timeout = options_.rdzv_timeout,
                                             .interrupted = [this] { return stop_requested(); },
                                             .names = options_.names},
                       self);
  logger()->info("{}: job '{}' attempt {}: this is node {} of {}, world size {}\n{}",
                 options_.names.agent, options_.run_id, a.index, a.nodes.node_rank, options_.nnodes,
                 a.nodes.world_size, a.nodes.table());
  store_->set(kCurrentAttemptKey, to_bytes(std::to_string(a.index)));
}

std::optional<LaunchAgent::Outcome> LaunchAgent::wait_out_full_attempt(Attempt& a) {
  const LauncherNames& names = options_.names;
  std::vector<std::string> done_keys;
  for (int n = 0; n < options_.nnodes; ++n) done_keys.push_back(a.done_key(n));
  auto check_not_finished = [&] {
    HSGD_CHECK(!store_->check(done_keys), "job '", options_.run_id, "' at ", endpoint_,
               " already finished: all ", options_.nnodes, " nodes of its attempt ", a.index,
               " are done. Is another job using the same ", names.run_id, "?");
  };
  check_not_finished();
  // The nodes of the attempt, by node rank, to name a silent one (all there once it is full,
  // unless one of them died between taking its place and announcing itself).
  std::vector<NodeInfo> nodes;
  std::vector<std::string> keys;
  for (int slot = 0; slot < options_.nnodes; ++slot) {
    keys.push_back(a.prefix + "rdzv/node/" + std::to_string(slot));
  }
  if (store_->check(keys)) {
    std::vector<NodeInfo> by_arrival;
    for (const auto& value : store_->multi_get(keys, options_.monitor_interval * 20)) {
      by_arrival.push_back(NodeInfo::decode(to_string(value)));
    }
    nodes = assign_node_ranks(by_arrival, 0, names).nodes;
  }
  auto ended = [&]() -> std::optional<Outcome> {
    if (!store_->check({a.failed_key()})) return std::nullopt;
    last_failure_ = FailureRecord::from_store(to_string(store_->get(a.failed_key())), a.index);
    return last_failure_->restartable() ? Outcome::kMissed : Outcome::kInterrupted;
  };
  if (auto outcome = ended()) return outcome;
  logger()->warn(
      "{}: job '{}' attempt {} already has its {} nodes; taking this node for one of them "
      "started again: waiting up to {} ms ({}) for the attempt to fail or for a node to go "
      "silent, then joining attempt {}",
      names.agent, options_.run_id, a.index, options_.nnodes, options_.heartbeat_timeout.count(),
      names.heartbeat_timeout, a.index + 1);

  const auto interval = std::min<milliseconds>(milliseconds(1000), options_.heartbeat_timeout / 4);
  Heartbeat watch(*store_, a.prefix, options_.nnodes, /*self=*/-1, interval,
                  options_.heartbeat_timeout);
  const auto deadline = Clock::now() + options_.heartbeat_timeout + 2 * interval;
  while (Clock::now() < deadline) {
    if (stop_requested()) return Outcome::kInterrupted;
    if (auto outcome = ended()) return outcome;
    // Nodes that are done stop beating once all are: not a failure.
    check_not_finished();
    if (const int silent = watch.tick(Clock::now()); silent >= 0) {
      std::string who = "node " + std::to_string(silent);
      if (!nodes.empty()) {
        who += " ('" + nodes[silent].host + "', " + names.agent + " pid " +
               std::to_string(nodes[silent].pid) + ")";
      }
      last_failure_ = publish_failure(
          a, FailureRecord{.kind = FailureRecord::Kind::kWorkerFailed,
                           .node_rank = silent,
                           .message = who + " sent no heartbeat for " +
                                      std::to_string(options_.heartbeat_timeout.count()) + " ms (" +
                                      names.heartbeat_timeout + ") while " + names.agent + " pid " +
                                      std::to_string(::getpid()) + " on '" +
                                      this_host(options_.hostname) + "' waited to join attempt " +
                                      std::to_string(a.index) + ": its " + names.agent +
                                      " died, and was probably started again"});
      return last_failure_->restartable() ? Outcome::kMissed : Outcome::kInterrupted;
    }
    std::this_thread::sleep_for(options_.monitor_interval);
  }
  logger()->error(
      "{}: all {} nodes of job '{}' attempt {} kept beating for {} ms: this node is "
      "not one of them",
      names.agent, options_.nnodes, options_.run_id, a.index, options_.heartbeat_timeout.count());
  return std::nullopt;
}

void LaunchAgent::spawn_workers(Attempt& a) {
  // Beat once before the workers start, so that the others see this node alive from now on.
  a.heartbeat = std::make_unique<Heartbeat>(
      *store_, a.prefix, options_.nnodes, a.nodes.node_rank,
      std::min<milliseconds>(milliseconds(1000), options_.heartbeat_timeout / 4),
      options_.heartbeat_timeout);
  a.heartbeat->beat(Clock::now());

  a.output = std::make_unique<OutputRouter>(options_.output, a.index);
  a.progress = std::make_unique<HangDetector>(options_.nproc_per_node, a.nodes.rank_offset,
                                              "node " + std::to_string(a.nodes.node_rank) + " '" +
                                                  a.nodes.nodes[a.nodes.node_rank].host + "'");
  const auto base_env = current_environment();
  for (int local = 0; local < options_.nproc_per_node; ++local) {
    const int rank = a.nodes.rank_offset + local;
    auto env = build_worker_env(base_env, WorkerEnvOptions{
                                              .rank = rank,
                                              .local_rank = local,
                                              .world_size = a.nodes.world_size,
                                              .local_world_size = options_.nproc_per_node,
                                              .group_rank = a.nodes.node_rank,
                                              .group_world_size = options_.nnodes,
                                              .master_addr = options_.master_addr,
                                              .master_port = options_.master_port,
                                              .run_id = options_.run_id,
                                              .restart_count = a.index,
                                              .max_restarts = options_.max_restarts,
                                              .token = options_.token,
                                              .token_file = options_.token_file,
                                              .insecure = options_.insecure,
                                              .progress_file = a.progress->path(),
                                          });
    try {
      a.workers.push_back(WorkerProcess::spawn(options_.program, env));
    } catch (const Error& e) {
      publish_failure(a, FailureRecord{.kind = FailureRecord::Kind::kFatal,
                                       .node_rank = a.nodes.node_rank,
                                       .rank = rank,
                                       .message = e.what()});
      stop_workers(a, SIGTERM);
      throw;
    }
    a.output->add(rank, a.workers.back().take_stdout_fd(), OutputRouter::Stream::kStdout);
    a.output->add(rank, a.workers.back().take_stderr_fd(), OutputRouter::Stream::kStderr);
    logger()->debug("{}: started rank {} (local rank {}) as pid {}", options_.names.agent, rank,
                    local, a.workers.back().pid());
  }
  if (!options_.output.log_dir.empty()) {
    logger()->info("{}: worker output goes to {}/attempt_{}/rank_<N>.log", options_.names.agent,
                   options_.output.log_dir, a.index);
  }
}

void LaunchAgent::account_steps(Attempt& a) {
  const int64_t resumed = a.progress->resumed_step();
  const int64_t last = a.progress->last_step();
  if (resumed >= 0 || last >= 0) any_step_ = true;
  if (resumed >= 0 && step_before_restart_ >= 0) {
    steps_lost_ += std::max<int64_t>(0, step_before_restart_ - resumed);
    step_before_restart_ = -1;
  }
  // An attempt that reported nothing lost nothing new: the step before it still counts.
  if (last >= 0) step_before_restart_ = last;
}

std::string LaunchAgent::steps_lost_text() const {
  if (!any_step_) return {};
  return "; " + std::to_string(steps_lost_) + (steps_lost_ == 1 ? " step" : " steps") +
         " lost to restarts";
}

}  // namespace hsgd::comm::launcher
