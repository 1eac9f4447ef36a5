#include "comm/launcher/agent.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "comm/error.h"
#include "comm/launcher/hang_detector.h"
#include "comm/launcher/heartbeat.h"
#include "comm/launcher/worker_env.h"
#include "comm/launcher/worker_process.h"
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

// A worker that failed inside a collective blames a peer that was silent outside any collective
// for at least this long (or stopped): long enough that a peer merely between two collectives of
// a normal step is not blamed.
constexpr milliseconds kSuspectSilence{2000};

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

}  // namespace

// The state of one attempt on this node.
struct LaunchAgent::Attempt {
  int index = 0;
  std::string prefix;  // store keys of this attempt
  NodeAssignment nodes;
  std::unique_ptr<OutputRouter> output;
  std::vector<WorkerProcess> workers;  // by local rank
  std::unique_ptr<Heartbeat> heartbeat;
  std::unique_ptr<HangDetector> progress;

  std::string failed_key() const { return prefix + "failed"; }
  std::string done_key(int node) const { return prefix + "done/" + std::to_string(node); }
};

LaunchAgent::LaunchAgent(AgentOptions options, std::shared_ptr<Store> store)
    : options_(std::move(options)),
      store_(std::move(store)),
      endpoint_(options_.master_addr + ":" + std::to_string(options_.master_port)),
      wake_fd_(make_eventfd()) {
  HSGD_CHECK(store_ != nullptr, "LaunchAgent: store must not be null");
  HSGD_CHECK(options_.nnodes >= 1, "hsgd-run: --nnodes ", options_.nnodes, " must be >= 1");
  HSGD_CHECK(options_.nproc_per_node >= 1, "hsgd-run: --nproc-per-node ", options_.nproc_per_node,
             " must be >= 1");
  HSGD_CHECK(options_.node_rank >= -1 && options_.node_rank < options_.nnodes,
             "hsgd-run: --node-rank ", options_.node_rank, " must be in [0, ", options_.nnodes,
             ") for --nnodes ", options_.nnodes);
  HSGD_CHECK(options_.max_restarts >= 0, "hsgd-run: --max-restarts ", options_.max_restarts,
             " must be >= 0");
  HSGD_CHECK(options_.rdzv_timeout.count() > 0, "hsgd-run: --rdzv-timeout must be positive");
  HSGD_CHECK(options_.heartbeat_timeout >= milliseconds(200), "hsgd-run: --heartbeat-timeout ",
             options_.heartbeat_timeout.count(), " ms must be at least 200 ms");
  HSGD_CHECK(options_.worker_timeout.count() >= 0, "hsgd-run: --worker-timeout ",
             options_.worker_timeout.count(), " ms must not be negative");
  HSGD_CHECK(!options_.program.empty(), "hsgd-run: no program given; expected '-- PROGRAM ARGS'");
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
  for (int attempt = 0; attempt <= options_.max_restarts; ++attempt) {
    const Outcome outcome = run_attempt(attempt);
    if (outcome == Outcome::kSucceeded) {
      logger()->info(
          "hsgd-run: job '{}' finished: all workers of all nodes exited 0 after {} "
          "restart(s){}",
          options_.run_id, attempt, steps_lost_text());
      return 0;
    }
    if (outcome == Outcome::kInterrupted) {
      const int sig = stop_signal_.load();
      if (sig != 0) return 128 + sig;
      logger()->error("hsgd-run: job '{}' stopped: {}", options_.run_id,
                      last_failure_ ? last_failure_->message : "interrupted");
      return 1;
    }
    if (last_failure_->restartable() && attempt < options_.max_restarts) {
      logger()->error("hsgd-run: job '{}' attempt {} failed. Root cause: {}", options_.run_id,
                      attempt, last_failure_->message);
      logger()->warn("hsgd-run: restarting all nodes: attempt {} of {} (--max-restarts {})",
                     attempt + 1, options_.max_restarts + 1, options_.max_restarts);
      continue;
    }
    logger()->error(
        "hsgd-run: job '{}' failed after {} restart(s) (--max-restarts {}){}. Root "
        "cause: {}",
        options_.run_id, attempt, options_.max_restarts, steps_lost_text(), last_failure_->message);
    return 1;
  }
  return 1;  // not reached: the last attempt returns above
}

LaunchAgent::Outcome LaunchAgent::run_attempt(int attempt) {
  Attempt a;
  a.index = attempt;
  a.prefix = "hsgd-run/attempt/" + std::to_string(attempt) + "/";

  // 1. Node rendezvous.
  const NodeInfo self{.host = this_host(options_.hostname),
                      .pid = static_cast<int>(::getpid()),
                      .local_world_size = options_.nproc_per_node,
                      .requested_rank = options_.node_rank};
  try {
    a.nodes =
        rendezvous_nodes(*store_,
                         NodeRendezvousOptions{.nnodes = options_.nnodes,
                                               .job_id = options_.run_id,
                                               .endpoint = endpoint_,
                                               .key_prefix = a.prefix,
                                               .timeout = options_.rdzv_timeout,
                                               .interrupted = [this] { return stop_requested(); }},
                         self);
  } catch (const RendezvousInterrupted&) {
    return Outcome::kInterrupted;
  }
  logger()->info("hsgd-run: job '{}' attempt {}: this is node {} of {}, world size {}\n{}",
                 options_.run_id, attempt, a.nodes.node_rank, options_.nnodes, a.nodes.world_size,
                 a.nodes.table());

  // Beat once before the workers start, so that the others see this node alive from now on.
  a.heartbeat = std::make_unique<Heartbeat>(
      *store_, a.prefix, options_.nnodes, a.nodes.node_rank,
      std::min<milliseconds>(milliseconds(1000), options_.heartbeat_timeout / 4),
      options_.heartbeat_timeout);
  a.heartbeat->beat(Clock::now());

  // 2. Spawn the workers.
  a.output = std::make_unique<OutputRouter>(options_.output, attempt);
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
                                              .restart_count = attempt,
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
    logger()->debug("hsgd-run: started rank {} (local rank {}) as pid {}", rank, local,
                    a.workers.back().pid());
  }
  if (!options_.output.log_dir.empty()) {
    logger()->info("hsgd-run: worker output goes to {}/attempt_{}/rank_<N>.log",
                   options_.output.log_dir, attempt);
  }

  // 3-5. Watch until success, failure or interrupt.
  const Outcome outcome = monitor(a);
  account_steps(a);
  return outcome;
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

std::optional<FailureRecord> LaunchAgent::find_hung_worker(Attempt& a) {
  if (options_.worker_timeout.count() == 0) return std::nullopt;
  auto hang = a.progress->find_hung(Clock::now(), options_.worker_timeout);
  if (!hang) return std::nullopt;
  const int rank = a.nodes.rank_offset + hang->local_rank;
  std::ostringstream msg;
  msg << hang->message << " [--worker-timeout "
      << std::chrono::duration<double>(options_.worker_timeout).count() << " s, attempt " << a.index
      << "]";
  const auto lines = a.output->tail(rank);
  if (!lines.empty()) {
    msg << "; its last " << lines.size() << " line(s):";
    for (const auto& line : lines) msg << "\n    [rank " << rank << "] " << line;
  }
  return FailureRecord{.kind = FailureRecord::Kind::kWorkerFailed,
                       .node_rank = a.nodes.node_rank,
                       .rank = rank,
                       .message = msg.str()};
}

LaunchAgent::Outcome LaunchAgent::monitor(Attempt& a) {
  std::vector<std::string> done_keys;
  for (int n = 0; n < options_.nnodes; ++n) done_keys.push_back(a.done_key(n));
  bool local_done = false;
  auto next_store_check = Clock::now();
  auto next_progress_check = Clock::now();
  while (true) {
    a.output->pump(options_.monitor_interval, wake_fd_);
    if (stop_requested()) {
      // Forward the signal first: the store round trip below must not delay it.
      const int sig = stop_signal_.load();
      signal_workers(a, sig);
      try {
        publish_failure(
            a, FailureRecord{.kind = FailureRecord::Kind::kInterrupted,
                             .node_rank = a.nodes.node_rank,
                             .signal = sig,
                             .message = "hsgd-run on node " + std::to_string(a.nodes.node_rank) +
                                        " received " + signal_name(sig)});
      } catch (const Error& e) {
        logger()->warn("hsgd-run: could not tell the other nodes to stop: {}", e.what());
      }
      wait_and_reap(a, sig);
      return Outcome::kInterrupted;
    }

    // Progress of the local workers (exited ones are not watched), sampled every
    // monitor_interval: a chatty worker wakes pump() far more often than that.
    const bool sample_progress = Clock::now() >= next_progress_check;
    if (sample_progress) {
      next_progress_check = Clock::now() + options_.monitor_interval;
      std::vector<pid_t> alive;
      for (auto& w : a.workers) alive.push_back(w.poll() ? -1 : w.pid());
      a.progress->observe(Clock::now(), alive);
    }

    // A local failure: this node may be the root cause.
    bool all_succeeded = true;
    for (int local = 0; local < static_cast<int>(a.workers.size()); ++local) {
      const auto& status = a.workers[local].poll();
      if (!status) {
        all_succeeded = false;
      } else if (!status->success()) {
        FailureRecord mine = describe_worker_failure(a, local);
        // It failed in a collective while a peer here never arrived: the peer is the cause.
        if (a.progress->read(local).collective_failures > 0) {
          if (auto hang = a.progress->suspect(Clock::now(), local, kSuspectSilence)) {
            mine = FailureRecord{
                .kind = FailureRecord::Kind::kWorkerFailed,
                .node_rank = a.nodes.node_rank,
                .rank = a.nodes.rank_offset + hang->local_rank,
                .message = hang->message +
                           "; it is the rank that did not arrive in the "
                           "collective that failed on rank " +
                           std::to_string(mine.rank) + " [attempt " + std::to_string(a.index) +
                           "]. Rank " + std::to_string(mine.rank) + "'s report: " + mine.message};
          }
        }
        last_failure_ = publish_failure(a, mine);
        if (last_failure_->encode() != mine.encode()) {
          logger()->warn("hsgd-run: {} (not the root cause: another node failed first)",
                         mine.message);
        }
        stop_workers(a, SIGTERM);
        return Outcome::kFailed;
      }
    }
    if (!all_succeeded && sample_progress) {
      if (auto hung = find_hung_worker(a)) {
        last_failure_ = publish_failure(a, *hung);
        if (last_failure_->encode() != hung->encode()) {
          logger()->warn("hsgd-run: {} (not the root cause: another node failed first)",
                         hung->message);
        }
        stop_workers(a, SIGTERM);
        return Outcome::kFailed;
      }
    }
    if (all_succeeded && !local_done) {
      local_done = true;
      store_->set(a.done_key(a.nodes.node_rank), to_bytes("ok"));
      logger()->info("hsgd-run: all {} workers of node {} exited 0", a.workers.size(),
                     a.nodes.node_rank);
    }

    // A failure elsewhere, or everyone done: ask the store, at most every monitor_interval.
    if (Clock::now() < next_store_check) continue;
    next_store_check = Clock::now() + options_.monitor_interval;
    if (store_->check({a.failed_key()})) {
      last_failure_ = FailureRecord::from_store(to_string(store_->get(a.failed_key())), a.index);
      if (last_failure_->node_rank >= 0) {
        logger()->warn("hsgd-run: node {} reported a failure; stopping the workers of node {}",
                       last_failure_->node_rank, a.nodes.node_rank);
      } else {
        logger()->warn("hsgd-run: {}; stopping the workers of node {}", last_failure_->message,
                       a.nodes.node_rank);
      }
      stop_workers(a, SIGTERM);
      return last_failure_->kind == FailureRecord::Kind::kWorkerFailed ? Outcome::kFailed
                                                                       : Outcome::kInterrupted;
    }
    if (const int silent = a.heartbeat->tick(Clock::now()); silent >= 0) {
      const NodeInfo& n = a.nodes.nodes[silent];
      last_failure_ = publish_failure(
          a, FailureRecord{.kind = FailureRecord::Kind::kWorkerFailed,
                           .node_rank = silent,
                           .message = "node " + std::to_string(silent) + " ('" + n.host +
                                      "', hsgd-run pid " + std::to_string(n.pid) +
                                      ") sent no heartbeat for " +
                                      std::to_string(a.heartbeat->timeout().count()) +
                                      " ms (--heartbeat-timeout): its hsgd-run died or lost "
                                      "the rendezvous server"});
      stop_workers(a, SIGTERM);
      return last_failure_->kind == FailureRecord::Kind::kWorkerFailed ? Outcome::kFailed
                                                                       : Outcome::kInterrupted;
    }
    if (local_done && store_->check(done_keys)) {
      for (auto& w : a.workers) w.kill_and_reap();  // reaps; kills any leftover grandchildren
      a.output->drain(milliseconds(500));
      return Outcome::kSucceeded;
    }
  }
}

FailureRecord LaunchAgent::describe_worker_failure(Attempt& a, int local_rank) {
  const int rank = a.nodes.rank_offset + local_rank;
  // The worker has exited: its output ends soon, unless it left children holding the pipe.
  a.output->drain(milliseconds(500), rank);
  const ExitStatus status = *a.workers[local_rank].poll();
  std::ostringstream msg;
  msg << "rank " << rank << " (node " << a.nodes.node_rank << " '"
      << a.nodes.nodes[a.nodes.node_rank].host << "', local rank " << local_rank << ", pid "
      << a.workers[local_rank].pid() << ") failed with " << status.describe() << " in attempt "
      << a.index;
  const auto lines = a.output->tail(rank);
  if (lines.empty()) {
    msg << "; it printed nothing";
  } else {
    msg << "; its last " << lines.size() << " line(s):";
    for (const auto& line : lines) msg << "\n    [rank " << rank << "] " << line;
  }
  if (const std::string path = a.output->log_path(rank); !path.empty()) {
    msg << "\n  full output: " << path;
  }
  return FailureRecord{.kind = FailureRecord::Kind::kWorkerFailed,
                       .node_rank = a.nodes.node_rank,
                       .rank = rank,
                       .message = msg.str()};
}

FailureRecord LaunchAgent::publish_failure(Attempt& a, FailureRecord record) {
  // The first record of the attempt wins; later ones learn the root cause from the store.
  auto result = store_->compare_set(a.failed_key(), {}, to_bytes(record.encode()));
  if (result.swapped) return record;
  return FailureRecord::from_store(to_string(result.current), a.index);
}

void LaunchAgent::stop_workers(Attempt& a, int sig) {
  signal_workers(a, sig);
  wait_and_reap(a, sig);
}

void LaunchAgent::signal_workers(Attempt& a, int sig) {
  for (auto& w : a.workers) {
    if (w.poll()) continue;
    w.signal_group(sig);
    // A stopped worker (SIGSTOP) would keep the signal pending until SIGKILL.
    w.signal_group(SIGCONT);
  }
}

void LaunchAgent::wait_and_reap(Attempt& a, int sig) {
  const auto deadline = Clock::now() + options_.grace_period;
  auto all_exited = [&] {
    for (auto& w : a.workers) {
      if (!w.poll()) return false;
    }
    return true;
  };
  // Keep forwarding output meanwhile: a worker blocked on a full pipe could not exit.
  // A second stop request (Ctrl-C twice) skips the grace period.
  while (!all_exited() && Clock::now() < deadline && stop_requests_.load() < 2) {
    if (a.output) a.output->pump(milliseconds(20));
  }
  int killed = 0;
  for (auto& w : a.workers) {
    if (!w.poll()) ++killed;
    w.kill_and_reap();
  }
  if (killed > 0) {
    logger()->warn("hsgd-run: {} worker(s) of node {} ignored {} for {} ms; sent SIGKILL", killed,
                   a.nodes.node_rank, signal_name(sig), options_.grace_period.count());
  }
  if (a.output) a.output->drain(milliseconds(200));
}

}  // namespace hsgd::comm::launcher
