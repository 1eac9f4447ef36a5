#include "comm/elastic/elastic_world.h"

#include <csignal>
#include <cstdlib>
#include <thread>

#include "comm/error.h"
#include "comm/log.h"
#include "comm/rendezvous/tcp_store.h"
#include "comm/store/store_barrier.h"
#include "comm/store/store_outage.h"

namespace hsgd::comm::elastic {
namespace {

using Clock = std::chrono::steady_clock;

std::shared_ptr<Store> make_store(const ElasticWorldOptions& options) {
  if (options.store != nullptr) return options.store;
  const InitOptions& init = options.init;
  return std::make_shared<TcpStore>(TcpStoreOptions{.host = init.master_addr,
                                                    .port = init.master_port,
                                                    .job_id = init.job_id,
                                                    .token = init.token,
                                                    .insecure = init.insecure,
                                                    .connect_timeout = init.timeout,
                                                    .timeout = init.timeout,
                                                    // A server started again within the join
                                                    // timeout gets the job back.
                                                    .reconnect_timeout = options.join_timeout});
}

}  // namespace

bool ElasticWorldOptions::enabled_in_env() {
  const char* id = std::getenv("HSGD_ELASTIC_NODE_ID");
  return id != nullptr && *id != '\0';
}

ElasticWorldOptions ElasticWorldOptions::from_env() {
  ElasticWorldOptions options;
  HSGD_CHECK(enabled_in_env(),
             "ElasticWorldOptions::from_env: HSGD_ELASTIC_NODE_ID is not set; an elastic world "
             "runs under hsgd-run --nnodes MIN:MAX");
  options.node_id = std::getenv("HSGD_ELASTIC_NODE_ID");
  options.init = InitOptions::from_env();
  // A vanished host is found by the collective timeout first, then by its agent's heartbeat
  // (--heartbeat-timeout, 30 s by default), then the rendezvous gives up (--rdzv-timeout).
  if (std::getenv("HSGD_TIMEOUT_MS") == nullptr) options.init.timeout = kDefaultCollectiveTimeout;
  if (const char* text = std::getenv("HSGD_ELASTIC_JOIN_TIMEOUT_MS")) {
    char* end = nullptr;
    const long long ms = std::strtoll(text, &end, 10);
    HSGD_CHECK(end != text && *end == '\0' && ms > 0, "HSGD_ELASTIC_JOIN_TIMEOUT_MS='", text,
               "': expected a positive integer (ms)");
    options.join_timeout = Duration(ms);
  }
  return options;
}

ElasticWorld::ElasticWorld(ElasticWorldOptions options)
    : options_(std::move(options)), store_(make_store(options_)) {
  // Gloo writes to its sockets without MSG_NOSIGNAL: a write to a member that just died must
  // fail that collective (EPIPE), not kill this survivor.
  ::signal(SIGPIPE, SIG_IGN);
  HSGD_CHECK(!options_.node_id.empty(), "ElasticWorldOptions::node_id is empty");
  HSGD_CHECK(options_.init.local_rank >= 0, "ElasticWorldOptions::init.local_rank ",
             options_.init.local_rank, " must be >= 0");
  HSGD_CHECK(options_.join_timeout.count() > 0, "ElasticWorldOptions::join_timeout ",
             options_.join_timeout.count(), " ms must be positive");
  HSGD_CHECK(options_.leave_timeout.count() > 0, "ElasticWorldOptions::leave_timeout ",
             options_.leave_timeout.count(), " ms must be positive");
}

ElasticWorld::~ElasticWorld() { abandon(); }

bool ElasticWorld::newer_generation_announced() {
  // Training does not wait for the rendezvous server: while it is away, no change is known.
  try {
    const NoServerWait no_wait;
    const std::optional<Generation> latest = read_latest_generation(*store_);
    return latest && latest->number > generation_.number;
  } catch (const ServerUnavailable&) {
    return false;
  }
}

void ElasticWorld::abandon() {
  if (world_ != nullptr && !world_->failed()) {
    // The watcher still runs: a generation that drops a member aborts the world, which ends
    // this wait within the group's mismatch-check slice.
    try {
      world_->shutdown(options_.leave_timeout);
    } catch (const std::exception& e) {
      logger()->warn("elastic generation {}: the members did not leave together ({}); aborting",
                     generation_.number, e.what());
    }
  }
  stop_watcher();
  if (world_ == nullptr) return;
  if (world_->failed()) {
    // The agents drop a member that went silent while this world's collectives waited for it,
    // without waiting for their heartbeat timeout (membership.h, failed_key).
    try {
      const NoServerWait no_wait;
      store_->set(failed_key(generation_.number),
                  to_bytes(std::to_string(options_.init.timeout.count())));
    } catch (const std::exception& e) {
      logger()->debug("elastic generation {}: could not record the failure: {}", generation_.number,
                      e.what());
    }
  }
  world_->abort();
  world_.reset();
}

void ElasticWorld::start_watcher() {
  watch_stop_ = false;
  watcher_ = std::thread([this, world = world_, current = generation_] {
    // Never blocks on a rendezvous server that is away: stop_watcher() joins this thread.
    const NoServerWait no_wait;
    const Duration period = options_.poll_interval * 4;
    std::unique_lock<std::mutex> lock(watch_mu_);
    while (!watch_cv_.wait_for(lock, period, [&] { return watch_stop_; })) {
      lock.unlock();
      bool lost = false;
      try {
        if (const auto latest = read_latest_generation(*store_);
            latest && latest->number > current.number) {
          for (const MemberNode& node : current.nodes) {
            if (latest->node_rank(node.id) < 0) lost = true;
          }
        }
      } catch (const std::exception& e) {
        // The store is away (its own outage handling applies); the collective timeout remains.
        logger()->debug("elastic watcher: {}", e.what());
      }
      if (lost) {
        logger()->warn(
            "elastic generation {}: a newer generation dropped a member; aborting "
            "this generation's collectives",
            current.number);
        world->abort();
        return;
      }
      lock.lock();
    }
  });
}

void ElasticWorld::stop_watcher() {
  if (!watcher_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    watch_stop_ = true;
  }
  watch_cv_.notify_all();
  watcher_.join();
}

bool ElasticWorld::gather(const Generation& g, Clock::time_point deadline) {
  const std::string prefix = generation_prefix(g.number) + "gather/";
  const int rank = g.rank_offset(options_.node_id) + options_.init.local_rank;
  store_->set(prefix + std::to_string(rank), to_bytes("1"));
  const std::vector<std::string> keys = store_barrier_keys(prefix, g.world_size());
  while (Clock::now() < deadline) {
    if (store_->check(keys)) return true;
    const std::optional<Generation> latest = read_latest_generation(*store_);
    if (latest && latest->number > g.number && latest->node_rank(options_.node_id) >= 0) {
      return false;
    }
    std::this_thread::sleep_for(options_.poll_interval);
  }
  return false;
}

std::shared_ptr<ProcessGroup> ElasticWorld::advance() {
  abandon();
  const auto deadline = Clock::now() + options_.join_timeout;
  int64_t skipped_up_to = generation_.number;
  auto reform_at = Clock::now() + options_.reform_after;
  while (Clock::now() < deadline) {
    const std::optional<Generation> latest = read_latest_generation(*store_);
    if (latest && latest->number <= skipped_up_to && latest->node_rank(options_.node_id) >= 0 &&
        Clock::now() >= reform_at) {
      // The last generation failed, yet the agents announce no change and none of its nodes
      // left (e.g. a collective timed out): its members form it again, as the next number; of
      // several proposals the first wins. When a node left, or its registration is not in the
      // store (a restarted rendezvous server its agent did not give it back to), the agents
      // decide (they keep MIN).
      bool any_left = false;
      for (const MemberNode& node : latest->nodes) {
        any_left =
            any_left || store_->check({left_key(node.id)}) || !store_->check({node_key(node.id)});
      }
      if (!any_left) {
        const Generation again{.number = latest->number + 1, .nodes = latest->nodes};
        logger()->warn(
            "elastic generation {} failed without a membership change; proposing "
            "generation {} with the same {} node(s)",
            latest->number, again.number, again.nodes.size());
        propose_generation(*store_, again);
      }
      reform_at = Clock::now() + options_.reform_after;
      continue;
    }
    if (!latest || latest->number <= skipped_up_to || latest->node_rank(options_.node_id) < 0) {
      if (store_->check({left_key(options_.node_id)}) &&
          (!latest || latest->node_rank(options_.node_id) < 0)) {
        HSGD_THROW(RemovedFromJob, "elastic node ", options_.node_id,
                   " was declared gone from the job (", left_key(options_.node_id),
                   " is set); its hsgd-run stops this worker and joins again as a new node");
      }
      std::this_thread::sleep_for(options_.poll_interval);
      continue;
    }
    const Generation g = *latest;
    if (!gather(g, deadline)) {
      skipped_up_to = g.number;
      reform_at = Clock::now() + options_.reform_after;
      continue;
    }
    InitOptions init = options_.init;
    init.rank = g.rank_offset(options_.node_id) + options_.init.local_rank;
    init.world_size = g.world_size();
    init.local_world_size =
        g.nodes[static_cast<size_t>(g.node_rank(options_.node_id))].local_world_size;
    HSGD_CHECK(options_.init.local_rank < init.local_world_size, "elastic node ", options_.node_id,
               ": local rank ", options_.init.local_rank, " is outside its node's ",
               init.local_world_size, " workers in generation ", g.number);
    init.node_rank = g.node_rank(options_.node_id);
    init.store = store_;
    init.key_prefix = generation_prefix(g.number);
    init.embedded_server = false;
    // A collective that lost a connection goes straight back to the caller, who moves to the
    // next generation: waiting for a dead member's report would only delay that. After a
    // timeout (a vanished host, a link outage) the members still say briefly who reached what,
    // so that the error names the ranks that lost contact.
    init.diagnosis_grace_after_loss = Duration(0);
    init.diagnosis_grace_after_timeout = std::chrono::seconds(2);
    try {
      world_ = init_process_group(init);
    } catch (const CommError& e) {  // Timeout included: a member died while connecting
      logger()->warn("elastic generation {} did not form ({}); waiting for the next one", g.number,
                     e.what());
      skipped_up_to = g.number;
      reform_at = Clock::now() + options_.reform_after;
      continue;
    }
    generation_ = g;
    start_watcher();
    logger()->info("elastic generation {}: rank {} of {} ({} nodes: {})", g.number, init.rank,
                   init.world_size, g.nodes.size(), g.describe());
    return world_;
  }
  HSGD_THROW(Timeout, "elastic node ", options_.node_id, ": no generation holding this node ",
             "formed within ", options_.join_timeout.count(),
             " ms (HSGD_ELASTIC_JOIN_TIMEOUT_MS); the newest is ",
             generation_.number >= 0 ? std::to_string(generation_.number) : "none");
}

}  // namespace hsgd::comm::elastic
