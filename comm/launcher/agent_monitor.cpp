// LaunchAgent, steps 3-5 of an attempt (agent.h): watching the workers and the other nodes until
// the attempt succeeds, fails or is interrupted, and stopping the workers.

#include <signal.h>

#include <sstream>

#include "comm/error.h"
#include "comm/launcher/agent.h"
#include "comm/launcher/detail/agent_attempt.h"
#include "comm/launcher/exit_codes.h"
#include "comm/launcher/worker_group.h"
#include "comm/log.h"
#include "comm/store/store_outage.h"

namespace hsgd::comm::launcher {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// A worker that failed inside a collective blames a peer that was silent outside any collective
// for at least this long (or stopped): long enough that a peer merely between two collectives of
// a normal step is not blamed.
constexpr milliseconds kSuspectSilence{2000};

}  // namespace

LaunchAgent::Outcome LaunchAgent::monitor(Attempt& a) {
  a.next_store_check = Clock::now();
  a.next_progress_check = Clock::now();
  // While the rendezvous server is away the store does not wait for it: the workers keep
  // training, output and signals keep flowing, and what needs the store is tried again next
  // round (a failure is published once the server is back). Past the store's reconnect bound
  // it throws CommError and run() ends (comm/store/store_outage.h).
  const NoServerWait no_wait;
  while (true) {
    a.output->pump(options_.monitor_interval, stop_.wake_fd());
    if (stop_requested()) return interrupt(a);
    try {
      const bool sampled = sample_progress(a);
      bool all_succeeded = false;
      if (auto cause = find_local_failure(a, sampled, all_succeeded)) return fail(a, *cause);
      if (all_succeeded && !a.local_done) mark_local_done(a);

      // A failure elsewhere, or everyone done: ask the store, at most every monitor_interval.
      if (Clock::now() < a.next_store_check) continue;
      a.next_store_check = Clock::now() + options_.monitor_interval;
      if (auto outcome = check_other_nodes(a)) return *outcome;
      if (a.local_done && all_nodes_done(a)) return succeed(a);
    } catch (const ServerUnavailable&) {
      // Logged by the store when it lost the server and when it reaches it again.
    }
  }
}

LaunchAgent::Outcome LaunchAgent::interrupt(Attempt& a) {
  // Forward the signal first: the store round trip below must not delay it.
  const int sig = stop_.signal();
  signal_workers(a, sig);
  try {
    publish_failure(a, FailureRecord{.kind = FailureRecord::Kind::kInterrupted,
                                     .node_rank = a.nodes.node_rank,
                                     .signal = sig,
                                     .message = options_.names.agent + " on node " +
                                                std::to_string(a.nodes.node_rank) + " received " +
                                                signal_name(sig)});
  } catch (const Error& e) {
    logger()->warn("{}: could not tell the other nodes to stop: {}", options_.names.agent,
                   e.what());
  }
  wait_and_reap(a, sig);
  return Outcome::kInterrupted;
}

bool LaunchAgent::sample_progress(Attempt& a) {
  // Exited workers are not watched. A chatty worker wakes pump() far more often than
  // monitor_interval: sample at that pace only.
  if (Clock::now() < a.next_progress_check) return false;
  a.next_progress_check = Clock::now() + options_.monitor_interval;
  std::vector<pid_t> alive;
  for (auto& w : a.workers) alive.push_back(w.poll() ? -1 : w.pid());
  a.progress->observe(Clock::now(), alive);
  return true;
}

std::optional<FailureRecord> LaunchAgent::find_local_failure(Attempt& a, bool sampled,
                                                             bool& all_succeeded) {
  all_succeeded = true;
  for (int local = 0; local < static_cast<int>(a.workers.size()); ++local) {
    const auto& status = a.workers[local].poll();
    if (!status) {
      all_succeeded = false;
      continue;
    }
    if (status->success()) continue;
    FailureRecord mine = describe_worker_failure(a, local);
    // It failed in a collective while a peer here never arrived: the peer is the cause.
    if (a.progress->read(local).collective_failures > 0) {
      if (auto hang = a.progress->suspect(Clock::now(), local, kSuspectSilence)) {
        return FailureRecord{
            .kind = FailureRecord::Kind::kWorkerFailed,
            .node_rank = a.nodes.node_rank,
            .rank = a.nodes.rank_offset + hang->local_rank,
            .message = hang->message +
                       "; it is the rank that did not arrive in the collective that failed on "
                       "rank " +
                       std::to_string(mine.rank) + " [attempt " + std::to_string(a.index) +
                       "]. Rank " + std::to_string(mine.rank) + "'s report: " + mine.message};
      }
    }
    return mine;
  }
  if (!all_succeeded && sampled) return find_hung_worker(a);
  return std::nullopt;
}

FailureRecord LaunchAgent::describe_worker_failure(Attempt& a, int local_rank) {
  const int rank = a.nodes.rank_offset + local_rank;
  // The worker has exited: its output ends soon, unless it left children holding the pipe.
  a.output->drain(milliseconds(500), rank);
  std::ostringstream who;
  who << "rank " << rank << " (node " << a.nodes.node_rank << " '"
      << a.nodes.nodes[a.nodes.node_rank].host << "', local rank " << local_rank << ", pid "
      << a.workers[local_rank].pid() << ")";
  return worker_exit_record(who.str(), "attempt " + std::to_string(a.index), "the job",
                            *a.workers[local_rank].poll(), *a.output, rank, a.nodes.node_rank);
}

std::optional<FailureRecord> LaunchAgent::find_hung_worker(Attempt& a) {
  if (options_.worker_timeout.count() == 0) return std::nullopt;
  auto hang = a.progress->find_hung(Clock::now(), options_.worker_timeout);
  if (!hang) return std::nullopt;
  const int rank = a.nodes.rank_offset + hang->local_rank;
  std::ostringstream msg;
  msg << hang->message << " [" << options_.names.worker_timeout << " "
      << std::chrono::duration<double>(options_.worker_timeout).count() << " s, attempt " << a.index
      << "]";
  append_last_lines(msg, *a.output, rank);
  return FailureRecord{.kind = FailureRecord::Kind::kWorkerFailed,
                       .node_rank = a.nodes.node_rank,
                       .rank = rank,
                       .message = msg.str()};
}

std::optional<LaunchAgent::Outcome> LaunchAgent::check_other_nodes(Attempt& a) {
  if (store_->check({a.failed_key()})) {
    last_failure_ = FailureRecord::from_store(to_string(store_->get(a.failed_key())), a.index);
    const auto kind = last_failure_->kind;
    if (last_failure_->node_rank >= 0 &&
        (kind == FailureRecord::Kind::kInterrupted || kind == FailureRecord::Kind::kPreempted)) {
      logger()->warn("{}: node {} stopped the job ({}); sending SIGTERM to the workers of node {}",
                     options_.names.agent, last_failure_->node_rank,
                     kind == FailureRecord::Kind::kPreempted ? "a worker was preempted"
                                                             : last_failure_->message,
                     a.nodes.node_rank);
    } else if (last_failure_->node_rank >= 0) {
      logger()->warn("{}: node {} reported a failure; stopping the workers of node {}",
                     options_.names.agent, last_failure_->node_rank, a.nodes.node_rank);
    } else {
      logger()->warn("{}: {}; stopping the workers of node {}", options_.names.agent,
                     last_failure_->message, a.nodes.node_rank);
    }
    return stop_after_failure(a);
  }
  if (const int silent = a.heartbeat->tick(Clock::now()); silent >= 0) {
    const NodeInfo& n = a.nodes.nodes[silent];
    return fail(
        a, FailureRecord{.kind = FailureRecord::Kind::kWorkerFailed,
                         .node_rank = silent,
                         .message = "node " + std::to_string(silent) + " ('" + n.host + "', " +
                                    options_.names.agent + " pid " + std::to_string(n.pid) +
                                    ") sent no heartbeat for " +
                                    std::to_string(a.heartbeat->timeout().count()) + " ms (" +
                                    options_.names.heartbeat_timeout + "): its " +
                                    options_.names.agent + " died or lost the rendezvous server"});
  }
  return std::nullopt;
}

void LaunchAgent::mark_local_done(Attempt& a) {
  store_->set(a.done_key(a.nodes.node_rank), to_bytes("ok"));
  a.local_done = true;
  logger()->info("{}: all {} workers of node {} exited 0", options_.names.agent, a.workers.size(),
                 a.nodes.node_rank);
}

bool LaunchAgent::all_nodes_done(Attempt& a) {
  std::vector<std::string> done_keys;
  for (int n = 0; n < options_.nnodes; ++n) done_keys.push_back(a.done_key(n));
  return store_->check(done_keys);
}

LaunchAgent::Outcome LaunchAgent::succeed(Attempt& a) {
  for (auto& w : a.workers) w.kill_and_reap();  // reaps; kills any leftover grandchildren
  a.output->drain(milliseconds(500));
  return Outcome::kSucceeded;
}

LaunchAgent::Outcome LaunchAgent::fail(Attempt& a, const FailureRecord& cause) {
  last_failure_ = publish_failure(a, cause);
  if (last_failure_->encode() != cause.encode() && cause.kind != FailureRecord::Kind::kPreempted) {
    logger()->warn("{}: {} (not the root cause: another node failed first)", options_.names.agent,
                   cause.message);
  }
  return stop_after_failure(a);
}

LaunchAgent::Outcome LaunchAgent::stop_after_failure(Attempt& a) {
  stop_workers(a, SIGTERM);
  // Only a worker's failure may restart the job; an interrupt or a fatal error elsewhere ends it.
  return last_failure_->restartable() ? Outcome::kFailed : Outcome::kInterrupted;
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

void LaunchAgent::signal_workers(Attempt& a, int sig) { launcher::signal_workers(a.workers, sig); }

void LaunchAgent::wait_and_reap(Attempt& a, int sig) {
  const int killed = reap_workers(a.workers, a.output.get(), options_.grace_period,
                                  [&] { return stop_.skip_grace(); });
  if (killed > 0) {
    logger()->warn("{}: {} worker(s) of node {} ignored {} for {} ms; sent SIGKILL",
                   options_.names.agent, killed, a.nodes.node_rank, signal_name(sig),
                   options_.grace_period.count());
  }
}

}  // namespace hsgd::comm::launcher
