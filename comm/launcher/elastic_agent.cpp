#include "comm/launcher/elastic_agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "comm/error.h"
#include "comm/launcher/exit_codes.h"
#include "comm/launcher/hang_detector.h"
#include "comm/launcher/heartbeat.h"
#include "comm/launcher/output_router.h"
#include "comm/launcher/worker_env.h"
#include "comm/launcher/worker_group.h"
#include "comm/launcher/worker_process.h"
#include "comm/log.h"
#include "comm/store/store_outage.h"

namespace hsgd::comm::launcher {

using elastic::Generation;
using elastic::MemberNode;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// How long the agents wait, after a restart of the rendezvous server, for the agent of a member
// of the newest generation to re-publish its registration (see observe_membership).
constexpr milliseconds kRepublishWait{10000};

// One incarnation of this node: its registration, workers and heartbeat.
struct ElasticAgent::Incarnation {
  int index = 0;
  MemberNode self;
  int64_t slot = -1;  // the registration's slot (membership.h)
  std::unique_ptr<OutputRouter> output;
  std::vector<WorkerProcess> workers;  // by local rank
  std::vector<int> ranks;              // the RANK each worker got, its key in `output`
  std::unique_ptr<HeartbeatBoard> heartbeat;
  std::unique_ptr<HangDetector> progress;  // the workers' progress (hang detection)
  Clock::time_point next_store_check{};
  Clock::time_point next_progress_check{};
  std::optional<Clock::time_point> below_min_since;  // fewer than min_nodes alive since
  // Since when a member of the newest generation has no registration in the store (a restarted
  // rendezvous server that its clients are re-populating); unset while every member is listed.
  std::optional<Clock::time_point> unlisted_since;
  std::optional<Clock::time_point> finish_deadline;  // the finished key appeared: wait until
  // Since when the rendezvous server leaves requests unanswered (a silent link); unset once a
  // round completed.
  std::optional<Clock::time_point> store_silent_since;
  // The newest generation whose workers reported a failed world (membership.h, failed_key), with
  // its nodes and how long its collectives waited; kept while the newest generation has the same
  // nodes (the workers may form them again), reset when the membership changes.
  struct ReportedFailure {
    int64_t generation = -1;
    std::vector<MemberNode> nodes;
    milliseconds waited{0};
  };
  std::optional<ReportedFailure> failure;
  Clock::time_point next_failure_check{};  // failed_key is read once per heartbeat interval
};

ElasticAgent::ElasticAgent(AgentOptions options, std::shared_ptr<Store> store)
    : options_(std::move(options)),
      store_(std::move(store)),
      host_(this_host(options_.hostname)),
      planner_(std::max(1, options_.min_nodes), std::max(options_.min_nodes, options_.max_nodes),
               std::max(milliseconds(0), options_.last_call)) {
  HSGD_CHECK(store_ != nullptr, "ElasticAgent: store must not be null");
  HSGD_CHECK(options_.min_nodes >= 1 && options_.min_nodes <= options_.max_nodes,
             "AgentOptions::min_nodes ", options_.min_nodes, " and max_nodes ", options_.max_nodes,
             " must satisfy 1 <= min_nodes <= max_nodes");
  check_agent_options(options_);
  HSGD_CHECK(options_.last_call.count() >= 0, "AgentOptions::last_call ",
             options_.last_call.count(), " ms must not be negative");
}

ElasticAgent::~ElasticAgent() = default;

void ElasticAgent::request_stop(int sig) { stop_.request(sig); }

int ElasticAgent::run() {
  // Resolve the program once up front: a typo fails here, before registering.
  const char* path = std::getenv("PATH");
  (void)resolve_program(options_.program[0],
                        path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  for (int index = 0;; ++index) {
    Incarnation inc;
    inc.index = index;
    start(inc);
    const Outcome outcome = monitor(inc);
    bool restart = false;
    const int code = run_outcome(index, outcome, restart);
    if (!restart) {
      report_end(code, index);
      return code;
    }
  }
}

void ElasticAgent::report_end(int code, int restarts) {
  // What the job went through, as far as the store tells; never waits for a server that is away.
  try {
    const NoServerWait no_wait;
    const std::optional<Generation> latest = elastic::read_latest_generation(*store_);
    int left = 0;
    for (const auto& r : elastic::read_registrations(*store_)) left += r.left ? 1 : 0;
    const int64_t thrown_away = store_->check({elastic::kStepsThrownAwayKey})
                                    ? store_->add(elastic::kStepsThrownAwayKey, 0)
                                    : 0;
    logger()->info(
        "{}: job '{}': this node ends with exit code {}: {} generation(s), {} node "
        "incarnation(s) left before the end ({} restart(s) of this node), {} worker-step(s) of "
        "training thrown away",
        options_.names.agent, options_.run_id, code, latest ? latest->number + 1 : 0, left,
        restarts, thrown_away);
  } catch (const Error& e) {
    logger()->warn(
        "{}: job '{}': this node ends with exit code {} ({} restart(s)); the job's "
        "counts are not available: {}",
        options_.names.agent, options_.run_id, code, restarts, e.what());
  }
}

int ElasticAgent::run_outcome(int incarnation, Outcome outcome, bool& restart) {
  const LauncherNames& names = options_.names;
  restart = false;
  switch (outcome) {
    case Outcome::kSucceeded:
      return 0;
    case Outcome::kJobFailed:
      return 1;
    case Outcome::kInterrupted: {
      if (local_preempted_) {
        logger()->warn(
            "{}: job '{}': the workers of this node wrote a checkpoint and exited {}; this node "
            "stops, exiting {}",
            names.agent, options_.run_id, kExitPreempted, kExitPreempted);
        return kExitPreempted;
      }
      return 128 + stop_.signal();
    }
    case Outcome::kFailed:
      break;
  }
  if (last_failure_->kind == FailureRecord::Kind::kWillRepeat) {
    logger()->error("{}: job '{}': this node stops without restarting ({} of {} {} left unused)",
                    names.agent, options_.run_id, options_.max_restarts - incarnation,
                    options_.max_restarts, names.max_restarts);
    return kExitWillRepeat;
  }
  if (last_failure_->kind == FailureRecord::Kind::kPreempted) return kExitPreempted;
  if (store_->check({elastic::kFinishedKey})) {
    logger()->error("{}: job '{}' finished on another node; this node's failure is not restarted",
                    names.agent, options_.run_id);
    return 1;
  }
  if (incarnation < options_.max_restarts) {
    logger()->warn("{}: job '{}': this node rejoins as incarnation {} ({} of {} {} used)",
                   names.agent, options_.run_id, incarnation + 1, incarnation + 1,
                   options_.max_restarts, names.max_restarts);
    restart = true;
    return 1;
  }
  logger()->error(
      "{}: job '{}': this node failed after {} restart(s) ({} {}); the other nodes go on",
      names.agent, options_.run_id, incarnation, names.max_restarts, options_.max_restarts);
  return 1;
}

void ElasticAgent::start(Incarnation& inc) {
  // 1. Register, beat once (the others see this node alive from now on), then spawn.
  inc.self =
      MemberNode{.id = host_ + "-" + std::to_string(::getpid()) + "-" + std::to_string(inc.index),
                 .host = host_,
                 .local_world_size = options_.nproc_per_node};
  inc.slot = elastic::register_node(*store_, inc.self, alive_linger());
  inc.heartbeat = std::make_unique<HeartbeatBoard>(
      *store_, elastic::kElasticPrefix, inc.self.id,
      std::min<milliseconds>(milliseconds(1000), options_.heartbeat_timeout / 4),
      options_.heartbeat_timeout);
  inc.heartbeat->beat(Clock::now());
  logger()->info("{}: job '{}': node {} ('{}') registered (slot {}), {} worker(s), {}..{} nodes",
                 options_.names.agent, options_.run_id, inc.self.id, host_, inc.slot,
                 options_.nproc_per_node, options_.min_nodes, options_.max_nodes);

  // The newest generation that already holds this incarnation, if any, gives the ranks.
  const std::optional<Generation> latest = elastic::read_latest_generation(*store_);
  const bool member = latest && latest->node_rank(inc.self.id) >= 0;
  inc.output = std::make_unique<OutputRouter>(options_.output, inc.index);
  // Ranks change with the generations; messages name the rank of the first one.
  inc.progress = std::make_unique<HangDetector>(options_.nproc_per_node,
                                                member ? latest->rank_offset(inc.self.id) : 0,
                                                "node " + inc.self.id + " '" + host_ + "'");
  const auto base_env = current_environment();
  for (int local = 0; local < options_.nproc_per_node; ++local) {
    const int rank = member ? latest->rank_offset(inc.self.id) + local : local;
    auto env = build_worker_env(
        base_env,
        WorkerEnvOptions{.rank = rank,
                         .local_rank = local,
                         .world_size = member ? latest->world_size() : options_.nproc_per_node,
                         .local_world_size = options_.nproc_per_node,
                         .group_rank = member ? latest->node_rank(inc.self.id) : 0,
                         .group_world_size = member ? static_cast<int>(latest->nodes.size()) : 1,
                         .master_addr = options_.master_addr,
                         .master_port = options_.master_port,
                         .run_id = options_.run_id,
                         .restart_count = inc.index,
                         .max_restarts = options_.max_restarts,
                         .token = options_.token,
                         .token_file = options_.token_file,
                         .insecure = options_.insecure,
                         .progress_file = inc.progress->path(),
                         .extra = {{"HSGD_ELASTIC_NODE_ID", inc.self.id},
                                   {"HSGD_ELASTIC_MIN_NODES", std::to_string(options_.min_nodes)},
                                   {"HSGD_ELASTIC_MAX_NODES", std::to_string(options_.max_nodes)},
                                   {"HSGD_ELASTIC_HEARTBEAT_MS",
                                    std::to_string(options_.heartbeat_timeout.count())}}});
    try {
      inc.workers.push_back(WorkerProcess::spawn(options_.program, env));
    } catch (const Error&) {
      stop_workers(inc, SIGTERM);
      store_->set(elastic::left_key(inc.self.id), to_bytes("spawn failed"));
      throw;
    }
    inc.ranks.push_back(rank);
    inc.output->add(rank, inc.workers.back().take_stdout_fd(), OutputRouter::Stream::kStdout);
    inc.output->add(rank, inc.workers.back().take_stderr_fd(), OutputRouter::Stream::kStderr);
  }
}

ElasticAgent::Outcome ElasticAgent::monitor(Incarnation& inc) {
  inc.next_store_check = Clock::now();
  // While the rendezvous server is away the store does not wait for it: the workers keep
  // training, output and signals keep flowing, and the membership is looked at again next round
  // (the heartbeats give every node a full timeout after such a gap). Past the store's reconnect
  // bound it throws CommError and the node stops (comm/store/store_outage.h).
  const NoServerWait no_wait;
  while (true) {
    inc.output->pump(options_.monitor_interval, stop_.wake_fd());
    if (stop_requested()) return interrupt(inc);
    bool all_succeeded = true;
    for (int local = 0; local < static_cast<int>(inc.workers.size()); ++local) {
      const auto& status = inc.workers[local].poll();
      if (!status) {
        all_succeeded = false;
      } else if (!status->success()) {
        return fail_locally(inc, local);
      }
    }
    if (!all_succeeded) {
      if (auto outcome = check_hang(inc)) return *outcome;
    }
    if (all_succeeded) {
      // 5. The job is done: nobody proposes from now on.
      store_->set(elastic::kFinishedKey, to_bytes(inc.self.id));
      logger()->info("{}: job '{}' finished: all {} workers of node {} exited 0",
                     options_.names.agent, options_.run_id, inc.workers.size(), inc.self.id);
      for (auto& w : inc.workers) w.kill_and_reap();  // reaps; kills leftover grandchildren
      inc.output->drain(milliseconds(500));
      return Outcome::kSucceeded;
    }
    if (Clock::now() < inc.next_store_check) continue;
    inc.next_store_check = Clock::now() + options_.monitor_interval;
    try {
      if (auto outcome = observe_membership(inc)) return *outcome;
      inc.store_silent_since.reset();
    } catch (const ServerUnavailable&) {
      // Logged by the store when it lost the server and when it reaches it again.
    } catch (const Timeout& e) {
      // A request in flight when the link to the server went silent (nothing closed, so the
      // store saw no outage): the next round tries again on a new connection, for rdzv_timeout.
      const auto now = Clock::now();
      if (!inc.store_silent_since) {
        inc.store_silent_since = now;
        logger()->warn(
            "{}: job '{}': the rendezvous server did not answer ({}); trying again "
            "for up to {} ms ({})",
            options_.names.agent, options_.run_id, e.what(), options_.rdzv_timeout.count(),
            options_.names.rdzv_timeout);
      } else if (now - *inc.store_silent_since > options_.rdzv_timeout) {
        throw;
      }
    }
  }
}

std::optional<ElasticAgent::Outcome> ElasticAgent::observe_membership(Incarnation& inc) {
  const LauncherNames& names = options_.names;
  const auto now = Clock::now();
  // 2. Who is alive: registered, not left, and beating.
  std::vector<elastic::Registration> registrations = elastic::read_registrations(*store_);
  const auto listed = [&registrations](const std::string& id) {
    return std::any_of(registrations.begin(), registrations.end(),
                       [&id](const auto& r) { return r.node.id == id; });
  };
  if (!listed(inc.self.id)) {
    // A restarted rendezvous server lost part of the slots counter, or another incarnation
    // holds this one's slot (membership.h, keep_registration).
    const int64_t slot = elastic::keep_registration(*store_, inc.self, inc.slot);
    if (slot != inc.slot) {
      logger()->warn(
          "{}: node {} registered again at slot {}: its slot {} names another incarnation since "
          "the rendezvous server was restarted",
          names.agent, inc.self.id, slot, inc.slot);
      inc.slot = slot;
    }
    registrations = elastic::read_registrations(*store_);
  }
  std::vector<std::string> watched;
  for (const auto& r : registrations) {
    if (!r.left) watched.push_back(r.node.id);
  }
  const std::vector<std::string> silent = inc.heartbeat->tick(now, watched);
  std::optional<Generation> latest = elastic::read_latest_generation(*store_);
  if (adopted_ && (!latest || latest->number < adopted_->number)) {
    // A restarted rendezvous server that did not get the newest generation back (its proposer
    // is gone, or not back yet): written again, so that no generation number is used twice.
    latest = elastic::propose_generation(*store_, *adopted_);
  }
  const std::vector<std::string> suspects = silent_after_failure(inc, latest, now);
  std::vector<MemberNode> alive;
  for (auto& r : registrations) {
    if (!r.left && !r.connected && r.node.id != inc.self.id) {
      // Its agent's process is gone (the server saw its connections close): no need to wait
      // for its heartbeat to stop.
      store_->set(elastic::left_key(r.node.id), to_bytes("disconnected"));
      r.left = true;
      logger()->warn(
          "{}: node {} ('{}'): its {} closed its connections to the rendezvous server "
          "(exited or killed): it left the job",
          names.agent, r.node.id, r.node.host, names.agent);
    }
    if (!r.left && std::find(silent.begin(), silent.end(), r.node.id) != silent.end()) {
      store_->set(elastic::left_key(r.node.id), to_bytes("silent"));
      r.left = true;
      logger()->warn("{}: node {} ('{}') sent no heartbeat for {} ms ({}): it left the job",
                     names.agent, r.node.id, r.node.host, options_.heartbeat_timeout.count(),
                     names.heartbeat_timeout);
    }
    if (!r.left && std::find(suspects.begin(), suspects.end(), r.node.id) != suspects.end()) {
      store_->set(elastic::left_key(r.node.id), to_bytes("silent after a failed collective"));
      r.left = true;
      logger()->warn(
          "{}: node {} ('{}') sent no heartbeat for {} ms while the collectives of generation "
          "{} failed (they wait {} ms): it left the job without waiting for the {} ms of {}",
          names.agent, r.node.id, r.node.host, inc.heartbeat->silent_for(r.node.id, now).count(),
          inc.failure->generation, inc.failure->waited.count(), options_.heartbeat_timeout.count(),
          names.heartbeat_timeout);
    }
    if (!r.left) alive.push_back(r.node);
  }
  if (latest) log_generation(*latest, inc.self.id);
  if (store_->check({elastic::kFinishedKey})) return wait_after_finish(inc, latest);

  // 3. Fewer than min_nodes: wait for joiners, for rdzv_timeout at most.
  const int count = static_cast<int>(alive.size());
  if (count < options_.min_nodes) {
    if (!inc.below_min_since) {
      inc.below_min_since = now;
      logger()->warn(
          "{}: job '{}': {} node(s) alive, fewer than the minimum {} ({}); waiting up "
          "to {} ms ({}) for nodes to join",
          names.agent, options_.run_id, count, options_.min_nodes, names.node_range,
          options_.rdzv_timeout.count(), names.rdzv_timeout);
    }
    if (now - *inc.below_min_since <= options_.rdzv_timeout) return std::nullopt;
    std::ostringstream msg;
    msg << "job '" << options_.run_id << "' failed: only " << count
        << " node(s) alive, fewer than the minimum " << options_.min_nodes << " ("
        << names.node_range << "), for " << options_.rdzv_timeout.count() << " ms ("
        << names.rdzv_timeout << ")";
    last_failure_ = FailureRecord{.kind = FailureRecord::Kind::kFatal, .message = msg.str()};
    logger()->error("{}: {}", names.agent, msg.str());
    stop_workers(inc, SIGTERM);
    leave(inc);
    return Outcome::kJobFailed;
  }
  if (inc.below_min_since) {
    inc.below_min_since.reset();
    logger()->info("{}: job '{}': {} nodes alive again", names.agent, options_.run_id, count);
  }
  // A member of the newest generation whose registration is not in the store, yet not declared
  // gone: a restarted rendezvous server is being given the job back by its clients, one at a
  // time. Nothing is proposed until its agent re-published it: a live agent does so within its
  // reconnection backoff (at most 2 s, tcp_store.h) of the server's return; one that did not
  // within kRepublishWait (or heartbeat_timeout, if shorter) died meanwhile.
  bool unlisted = false;
  if (latest) {
    for (const MemberNode& node : latest->nodes) unlisted = unlisted || !listed(node.id);
  }
  if (unlisted) {
    if (!inc.unlisted_since) inc.unlisted_since = now;
    if (now - *inc.unlisted_since < std::min(kRepublishWait, options_.heartbeat_timeout)) {
      return std::nullopt;
    }
  } else {
    inc.unlisted_since.reset();
  }
  if (auto proposal = planner_.plan(now, latest, alive)) {
    log_generation(elastic::propose_generation(*store_, *proposal), inc.self.id);
  }
  return std::nullopt;
}

std::vector<std::string> ElasticAgent::silent_after_failure(Incarnation& inc,
                                                            const std::optional<Generation>& latest,
                                                            Clock::time_point now) {
  if (!latest) return {};
  if (inc.failure && inc.failure->nodes != latest->nodes) inc.failure.reset();
  const bool unseen = !inc.failure || inc.failure->generation < latest->number;
  // A silence is measured in heartbeat intervals: reading the marker more often gains nothing.
  if (unseen && now >= inc.next_failure_check) {
    inc.next_failure_check = now + inc.heartbeat->interval();
    const std::string key = elastic::failed_key(latest->number);
    if (store_->check({key})) {
      milliseconds waited = options_.heartbeat_timeout;
      try {
        waited = milliseconds(std::stoll(to_string(store_->get(key, milliseconds(1000)))));
      } catch (const std::invalid_argument&) {
      } catch (const std::out_of_range&) {
      }
      inc.failure = Incarnation::ReportedFailure{
          .generation = latest->number, .nodes = latest->nodes, .waited = waited};
    }
  }
  if (!inc.failure) return {};
  // A member whose collective partners waited for it and whose agent has been silent for half
  // that wait is taken as gone: a live agent beats every interval.
  const milliseconds threshold = std::clamp<milliseconds>(
      inc.failure->waited / 2, 3 * inc.heartbeat->interval(), options_.heartbeat_timeout);
  std::vector<std::string> gone;
  for (const MemberNode& node : latest->nodes) {
    if (node.id != inc.self.id && inc.heartbeat->silent_for(node.id, now) >= threshold) {
      gone.push_back(node.id);
    }
  }
  return gone;
}

std::optional<ElasticAgent::Outcome> ElasticAgent::wait_after_finish(
    Incarnation& inc, const std::optional<Generation>& latest) {
  const LauncherNames& names = options_.names;
  if (!inc.finish_deadline) {
    const milliseconds wait = options_.heartbeat_timeout + options_.grace_period;
    inc.finish_deadline = Clock::now() + wait;
    logger()->info(
        "{}: job '{}' finished on another node; waiting up to {} ms for the workers "
        "of node {}",
        names.agent, options_.run_id, wait.count(), inc.self.id);
  }
  if (Clock::now() < *inc.finish_deadline) return std::nullopt;
  const bool member = latest && latest->node_rank(inc.self.id) >= 0;
  logger()->warn("{}: job '{}' finished; the workers of node {} still run: stopping them",
                 names.agent, options_.run_id, inc.self.id);
  stop_workers(inc, SIGTERM);
  if (!member) return Outcome::kSucceeded;
  last_failure_ = FailureRecord{
      .kind = FailureRecord::Kind::kFatal,
      .message = "the workers of node " + inc.self.id + ", a member of generation " +
                 std::to_string(latest->number) + ", did not exit after the job finished"};
  logger()->error("{}: {}", names.agent, last_failure_->message);
  return Outcome::kJobFailed;
}

ElasticAgent::Outcome ElasticAgent::fail_locally(Incarnation& inc, int local_rank) {
  // 4. The worker has exited: its output ends soon, unless it left children holding the pipe.
  const int rank = inc.ranks[local_rank];
  inc.output->drain(milliseconds(500), rank);
  std::ostringstream who;
  who << "local rank " << local_rank << " of node " << inc.self.id << " ('" << host_ << "', pid "
      << inc.workers[local_rank].pid() << ")";
  last_failure_ =
      worker_exit_record(who.str(), "incarnation " + std::to_string(inc.index), "this node",
                         *inc.workers[local_rank].poll(), *inc.output, rank, /*node_rank=*/-1);
  if (last_failure_->kind == FailureRecord::Kind::kPreempted) {
    logger()->warn("{}: {}", options_.names.agent, last_failure_->message);
  } else {
    logger()->error("{}: {}", options_.names.agent, last_failure_->message);
  }
  stop_workers(inc, SIGTERM);
  leave(inc);
  return Outcome::kFailed;
}

std::optional<ElasticAgent::Outcome> ElasticAgent::check_hang(Incarnation& inc) {
  const auto now = Clock::now();
  if (options_.worker_timeout.count() == 0 || now < inc.next_progress_check) return std::nullopt;
  inc.next_progress_check = now + options_.monitor_interval;
  std::vector<pid_t> pids;
  for (auto& w : inc.workers) pids.push_back(w.poll() ? -1 : w.pid());
  inc.progress->observe(now, pids);
  const auto hang = inc.progress->find_hung(now, options_.worker_timeout);
  if (!hang) return std::nullopt;
  // A hung worker holds up every collective of its node: the node leaves as if it had failed,
  // and comes back as a joining node.
  std::ostringstream msg;
  msg << hang->message << " [" << options_.names.worker_timeout << " "
      << std::chrono::duration<double>(options_.worker_timeout).count() << " s, incarnation "
      << inc.index << "]; stopping the workers of node " << inc.self.id;
  append_last_lines(msg, *inc.output, inc.ranks[static_cast<size_t>(hang->local_rank)]);
  last_failure_ = FailureRecord{.kind = FailureRecord::Kind::kWorkerFailed,
                                .node_rank = -1,
                                .rank = inc.ranks[static_cast<size_t>(hang->local_rank)],
                                .message = msg.str()};
  logger()->error("{}: {}", options_.names.agent, last_failure_->message);
  ::kill(inc.workers[static_cast<size_t>(hang->local_rank)].pid(), SIGKILL);  // stopped: no TERM
  stop_workers(inc, SIGTERM);
  leave(inc);
  return Outcome::kFailed;
}

ElasticAgent::Outcome ElasticAgent::interrupt(Incarnation& inc) {
  // The workers of a run that writes checkpoints take the signal as a preemption: every rank of
  // the job stops at one step boundary after a checkpoint and exits 75. Leaving the membership
  // before they are done would abort the generation that writes it, so this node leaves only
  // once its workers exited, and proposes a generation without itself only when they did not
  // stop for a preemption (then the other nodes' workers are stopping too).
  stop_workers(inc, stop_.signal());
  local_preempted_ = workers_preempted(inc.workers);
  try {
    leave(inc, /*propose_without=*/!local_preempted_);
  } catch (const Error& e) {
    logger()->warn("{}: could not record that node {} left: {}", options_.names.agent, inc.self.id,
                   e.what());
  }
  return Outcome::kInterrupted;
}

milliseconds ElasticAgent::alive_linger() const {
  // Long enough to ride out a reconnection of this agent's store to the same server, short
  // against the heartbeat timeout, which covers the hosts that vanish without closing anything.
  return std::clamp<milliseconds>(options_.heartbeat_timeout / 10, milliseconds(100),
                                  milliseconds(1000));
}

void ElasticAgent::leave(Incarnation& inc, bool propose_without) {
  // Waits for a server that is away (the monitor does not): a node whose workers failed while
  // the link to the server was down must still be recorded as gone, so that it can rejoin.
  const ServerWait wait_for_the_server;
  store_->set(elastic::left_key(inc.self.id), to_bytes("left"));
  store_->delete_key(elastic::alive_key(inc.self.id));
  logger()->warn("{}: node {} ('{}') left job '{}'", options_.names.agent, inc.self.id, host_,
                 options_.run_id);
  // The survivors need not wait for the heartbeat timeout to see this node gone.
  if (!propose_without || store_->check({elastic::kFinishedKey})) return;
  const std::optional<Generation> latest = elastic::read_latest_generation(*store_);
  if (!latest || latest->node_rank(inc.self.id) < 0) return;
  Generation without{.number = latest->number + 1};
  for (const MemberNode& node : latest->nodes) {
    if (node.id != inc.self.id) without.nodes.push_back(node);
  }
  if (static_cast<int>(without.nodes.size()) < options_.min_nodes) return;
  log_generation(elastic::propose_generation(*store_, without), inc.self.id);
}

void ElasticAgent::stop_workers(Incarnation& inc, int sig) {
  signal_workers(inc.workers, sig);
  const int killed = reap_workers(inc.workers, inc.output.get(), options_.grace_period,
                                  [&] { return stop_.skip_grace(); });
  if (killed > 0) {
    logger()->warn("{}: {} worker(s) of node {} ignored {} for {} ms; sent SIGKILL",
                   options_.names.agent, killed, inc.self.id, signal_name(sig),
                   options_.grace_period.count());
  }
}

void ElasticAgent::log_generation(const Generation& g, const std::string& self_id) {
  if (adopted_ && adopted_->number >= g.number) return;
  const LauncherNames& names = options_.names;
  const int rank = g.node_rank(self_id);
  logger()->info("{}: generation {}: {} nodes, {} workers: {}{}", names.agent, g.number,
                 g.nodes.size(), g.world_size(), g.describe(),
                 rank >= 0 ? " (this node is node rank " + std::to_string(rank) + ")"
                           : std::string(" (without this node)"));
  if (adopted_) {
    for (const MemberNode& node : adopted_->nodes) {
      if (g.node_rank(node.id) < 0) {
        logger()->warn("{}: generation {}: node {} ('{}') is gone", names.agent, g.number, node.id,
                       node.host);
      }
    }
    for (const MemberNode& node : g.nodes) {
      if (adopted_->node_rank(node.id) < 0) {
        logger()->info("{}: generation {}: node {} ('{}') joined", names.agent, g.number, node.id,
                       node.host);
      }
    }
  }
  adopted_ = g;
}

}  // namespace hsgd::comm::launcher
