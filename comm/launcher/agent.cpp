#include "comm/launcher/agent.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "comm/error.h"
#include "comm/launcher/detail/agent_attempt.h"
#include "comm/launcher/worker_env.h"
#include "comm/log.h"

namespace hsgd::comm::launcher {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::string this_host(const std::string& configured) {
  if (!configured.empty()) return configured;
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

int make_eventfd() {
  int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  HSGD_CHECK_AS(Error, fd >= 0, "LaunchAgent: eventfd failed: ", std::strerror(errno));
  return fd;
}

}  // namespace

LaunchAgent::LaunchAgent(AgentOptions options, std::shared_ptr<Store> store)
    : options_(std::move(options)),
      store_(std::move(store)),
      endpoint_(options_.master_addr + ":" + std::to_string(options_.master_port)),
      wake_fd_(make_eventfd()) {
  HSGD_CHECK(store_ != nullptr, "LaunchAgent: store must not be null");
  HSGD_CHECK(options_.nnodes >= 1, "AgentOptions::nnodes ", options_.nnodes, " must be >= 1");
  HSGD_CHECK(options_.nproc_per_node >= 1, "AgentOptions::nproc_per_node ", options_.nproc_per_node,
             " must be >= 1");
  HSGD_CHECK(options_.node_rank >= -1 && options_.node_rank < options_.nnodes,
             "AgentOptions::node_rank ", options_.node_rank, " must be -1 or in [0, ",
             options_.nnodes, ") for AgentOptions::nnodes ", options_.nnodes);
  HSGD_CHECK(options_.max_restarts >= 0, "AgentOptions::max_restarts ", options_.max_restarts,
             " must be >= 0");
  HSGD_CHECK(options_.rdzv_timeout.count() > 0, "AgentOptions::rdzv_timeout ",
             options_.rdzv_timeout.count(), " ms must be positive");
  HSGD_CHECK(options_.heartbeat_timeout >= milliseconds(200), "AgentOptions::heartbeat_timeout ",
             options_.heartbeat_timeout.count(), " ms must be at least 200 ms");
  HSGD_CHECK(options_.worker_timeout.count() >= 0, "AgentOptions::worker_timeout ",
             options_.worker_timeout.count(), " ms must not be negative");
  HSGD_CHECK(!options_.program.empty(),
             "AgentOptions::program is empty; expected the worker's argv");
}

LaunchAgent::~LaunchAgent() { ::close(wake_fd_); }

void LaunchAgent::request_stop(int sig) {
  // Async-signal-safe: atomics and write(2) only.
  int expected = 0;
  stop_signal_.compare_exchange_strong(expected, sig);
  stop_requests_.fetch_add(1);
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

int LaunchAgent::run() {
  // Resolve the program once up front: a typo fails here, before any rendezvous.
  (void)resolve_program(options_.program[0], [] {
    const char* path = std::getenv("PATH");
    return std::string(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  }());
  const LauncherNames& names = options_.names;
  for (int attempt = 0; attempt <= options_.max_restarts; ++attempt) {
    const Outcome outcome = run_attempt(attempt);
    if (outcome == Outcome::kSucceeded) {
      logger()->info(
          "{}: job '{}' finished: all workers of all nodes exited 0 after {} "
          "restart(s){}",
          names.agent, options_.run_id, attempt, steps_lost_text());
      return 0;
    }
    if (outcome == Outcome::kInterrupted) {
      const int sig = stop_signal_.load();
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
  return 1;  // not reached: the last attempt returns above
}

LaunchAgent::Outcome LaunchAgent::run_attempt(int attempt) {
  Attempt a;
  a.index = attempt;
  a.prefix = "hsgd-run/attempt/" + std::to_string(attempt) + "/";
  try {
    join_nodes(a);
  } catch (const RendezvousInterrupted&) {
    return Outcome::kInterrupted;
  }
  spawn_workers(a);
  const Outcome outcome = monitor(a);
  account_steps(a);
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
