#include "comm/process_group/process_group.h"

#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>

#include <algorithm>

#include "comm/error.h"
#include "comm/format_ranks.h"
#include "comm/log.h"
#include "comm/process_group/agreement.h"
#include "comm/process_group/detail/collective_fingerprint.h"
#include "comm/process_group/detail/collective_queue.h"
#include "comm/process_group/detail/collective_watchdog.h"
#include "comm/process_group/detail/gloo_abort.h"
#include "comm/process_group/detail/gloo_allreduce.h"
#include "comm/process_group/detail/two_level_allreduce.h"
#include "comm/process_group/shm_allreduce.h"
#include "comm/store/gloo_store.h"
#include "comm/store/store_barrier.h"

// The parts of a group live in comm/process_group/detail: the collective queue and its worker
// thread (collective_queue), the Gloo allreduce algorithms and their cache (gloo_allreduce), the
// two-level allreduce across nodes (two_level_allreduce) and child group creation
// (child_group). This file connects a group and reports its failures; the collectives are in
// process_group_collectives.cpp.

namespace hsgd::comm {

using hsgd::detail::CollectiveFingerprint;

const char* to_string(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::kAuto:
      return "auto";
    case AllreduceAlgorithm::kHalvingDoubling:
      return "halving-doubling";
    case AllreduceAlgorithm::kRingChunked:
      return "ring-chunked";
    case AllreduceAlgorithm::kRing:
      return "ring";
    case AllreduceAlgorithm::kPinnedRing:
      return "pinned-ring";
    case AllreduceAlgorithm::kDirect:
      return "direct";
    case AllreduceAlgorithm::kDirectScatter:
      return "direct-scatter";
  }
  return "?";
}

namespace {
constexpr AllreduceAlgorithm kAllreduceAlgorithms[] = {
    AllreduceAlgorithm::kAuto,         AllreduceAlgorithm::kHalvingDoubling,
    AllreduceAlgorithm::kRingChunked,  AllreduceAlgorithm::kRing,
    AllreduceAlgorithm::kPinnedRing,   AllreduceAlgorithm::kDirect,
    AllreduceAlgorithm::kDirectScatter};
}  // namespace

std::vector<std::string> allreduce_algorithm_names() {
  std::vector<std::string> names;
  for (const auto algorithm : kAllreduceAlgorithms) names.emplace_back(to_string(algorithm));
  return names;
}

std::optional<AllreduceAlgorithm> parse_allreduce_algorithm(std::string_view name) {
  for (const auto algorithm : kAllreduceAlgorithms) {
    if (name == to_string(algorithm)) return algorithm;
  }
  return std::nullopt;
}

AllreduceAlgorithm allreduce_algorithm_named(std::string_view name, std::string_view what) {
  if (const auto algorithm = parse_allreduce_algorithm(name)) return *algorithm;
  std::string choices;
  for (const auto& n : allreduce_algorithm_names()) choices += (choices.empty() ? "" : ", ") + n;
  throw InvalidArgument(str_cat(what, "='", name, "' must be one of ", choices));
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

namespace {

// Set by abort(), holding the rank that aborted the group.
std::string aborted_key(const std::string& key_prefix) { return key_prefix + "aborted"; }

bool looks_like_timeout(const std::string& message) {
  return message.find("imed out") != std::string::npos ||
         message.find("imeout") != std::string::npos;
}

}  // namespace

ProcessGroup::ProcessGroup(Options options) : options_(std::move(options)) {
  HSGD_CHECK(options_.store != nullptr, "ProcessGroup '", options_.name, "': a store is required");
  HSGD_CHECK(!options_.ranks.empty(), "ProcessGroup '", options_.name,
             "': ranks must not be empty");
  HSGD_CHECK(options_.rank >= 0 && options_.rank < size(), "ProcessGroup '", options_.name,
             "': rank ", options_.rank, " must be in [0, ", size(), ")");
  HSGD_CHECK(options_.timeout.count() > 0, "ProcessGroup '", options_.name, "': timeout ",
             options_.timeout.count(), " ms must be positive");
  HSGD_CHECK(size() == 1 || options_.device != nullptr, "ProcessGroup '", options_.name,
             "': a Gloo device is required for ", size(), " ranks");
  HSGD_CHECK(options_.local_world_size >= 0, "ProcessGroup '", options_.name,
             "': local_world_size ", options_.local_world_size, " must be >= 0 (0: not declared)");
  HSGD_CHECK(options_.mismatch_check.count() >= 0, "ProcessGroup '", options_.name,
             "': mismatch_check ", options_.mismatch_check.count(),
             " ms must be >= 0 (0: no check)");
  HSGD_CHECK(options_.node_rank >= -1, "ProcessGroup '", options_.name, "': node_rank ",
             options_.node_rank, " must be >= 0, or -1 (not declared)");
  connect();
  if (size() > 1 && options_.mismatch_check.count() > 0) {
    watchdog_ = std::make_unique<hsgd::detail::CollectiveWatchdog>(
        hsgd::detail::CollectiveWatchdog::Config{.store = options_.store,
                                                 .key_prefix = options_.key_prefix,
                                                 .rank = rank(),
                                                 .size = size(),
                                                 .threshold = options_.mismatch_check,
                                                 .group_name = options_.name},
        [this](const hsgd::detail::MismatchReport& report) { abort_on_mismatch(report); });
  }
  queue_ = std::make_unique<hsgd::detail::CollectiveQueue>(
      options_.name, options_.timeout,
      [this](const CollectiveFingerprint& fp, const std::exception& e) {
        return on_failure(fp, e);
      },
      watchdog_.get());
}

ProcessGroup::~ProcessGroup() {
  queue_.reset();  // runs the collectives still queued, then stops the worker
  watchdog_.reset();
  // Algorithms hold buffers registered with the context's pairs: destroy them first.
  gloo_allreduce_.reset();
}

void ProcessGroup::connect() {
  // Everyone announces itself first, so that a missing rank is named ("ranks [3] did not
  // arrive") instead of surfacing as an anonymous Gloo store timeout.
  // The value is this rank's node identity when the group may use shared memory: within one
  // node (at most ShmAllreduce::kMaxRanks members), or within each node of a group that spans
  // nodes (two levels, at any group size).
  const bool try_shm = options_.shared_memory && size() > 1;
  const std::string arrived = options_.key_prefix + "arrived/";
  store_barrier(
      *options_.store, arrived, rank(), size(), options_.timeout,
      {.value = to_bytes(try_shm ? node_identity(options_.node_rank) : std::string("1")),
       .what = str_cat("ProcessGroup '", options_.name, "' (rank ", rank(), " of ", size(), ")"),
       .global_ranks = options_.ranks});
  if (size() == 1) return;  // no peers: collectives are local

  auto context = std::make_shared<gloo::rendezvous::Context>(rank(), size());
  context->setTimeout(options_.timeout);
  auto gloo_store = as_gloo_store(options_.store, options_.key_prefix + "gloo/", options_.timeout);
  auto device = options_.device;
  try {
    context->connectFullMesh(*gloo_store, device);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    HSGD_THROW(CommError, "ProcessGroup '", options_.name, "' (rank ", rank(), " of ", size(),
               "): connecting to the other ranks failed: ", e.what());
  }
  hsgd::detail::publish_gloo_connections(*context, *options_.store, options_.key_prefix);
  context_ = std::move(context);
  gloo_allreduce_ = std::make_unique<hsgd::detail::GlooAllreduce>(context_, options_.timeout);
  if (try_shm) {
    const auto nodes =
        options_.store->multi_get(store_barrier_keys(arrived, size()), options_.timeout);
    const bool one_node = std::all_of(nodes.begin(), nodes.end(),
                                      [&](const Bytes& node) { return node == nodes.front(); });
    if (one_node && size() <= ShmAllreduce::kMaxRanks) {
      shm_ = ShmAllreduce::connect(*options_.store, options_.key_prefix + "shm/", rank(), size(),
                                   options_.timeout, options_.name);
    } else if (!one_node) {
      two_level_ = hsgd::detail::TwoLevelAllreduce::connect(options_, nodes);
    }
  }
  logger()->debug("rank {} of group '{}' connected ({} ranks, prefix '{}', allreduce over {})",
                  rank(), options_.name, size(), options_.key_prefix,
                  shm_         ? "shared memory"
                  : two_level_ ? "shared memory within nodes and TCP between them"
                               : "TCP");
}

std::shared_ptr<Work> ProcessGroup::enqueue(CollectiveFingerprint fp, RunOn run_on,
                                            std::function<void(uint32_t tag)> run) {
  std::weak_ptr<ProcessGroup> self = weak_from_this();
  // A collective of an aborted group must not reach Gloo: a write to a connection that abort()
  // shut down raises SIGPIPE, which kills a process that did not ignore it.
  auto checked = [this, run = std::move(run)](uint32_t tag) {
    if (aborted_.load()) {
      HSGD_THROW(CommError, "group '", options_.name, "' was aborted (ProcessGroup::abort)");
    }
    run(tag);
  };
  auto helper = [self](const Work& w, Duration timeout) {
    if (auto group = self.lock()) group->queue_->help(w, timeout);
  };
  if (run_on == RunOn::kCaller) {
    return queue_->run_or_enqueue(std::move(fp), std::move(checked), std::move(helper));
  }
  return queue_->enqueue(std::move(fp), std::move(checked), std::move(helper));
}

// Runs on the watchdog thread while the worker waits in the collective: every wait of this
// group's transport ends at once (the Gloo sockets are shut down, the shared-memory barrier
// aborts), so the worker reports the mismatch through on_failure. The group is broken anyway.
void ProcessGroup::abort_on_mismatch(const hsgd::detail::MismatchReport& report) {
  logger()->error("group '{}' (rank {} of {}): {}", options_.name, rank(), size(), report.message);
  abort_transport();
}

void ProcessGroup::abort() {
  if (aborted_.exchange(true)) return;
  std::vector<std::shared_ptr<ProcessGroup>> children;
  {
    std::lock_guard<std::mutex> lock(children_mu_);
    for (const auto& weak : children_) {
      if (auto child = weak.lock()) children.push_back(std::move(child));
    }
  }
  for (const auto& child : children) child->abort();
  logger()->debug("group '{}' (rank {} of {}): aborted", options_.name, rank(), size());
  // Written before the connections are shut down, so that a peer whose collective fails from it
  // finds the key and reports the abort at once (on_failure) instead of waiting the failure
  // diagnosis's grace for this rank, which is in no collective.
  if (size() > 1) {
    try {
      options_.store->set(aborted_key(options_.key_prefix), to_bytes(std::to_string(rank())));
    } catch (const std::exception& e) {
      logger()->warn("group '{}' (rank {} of {}): could not record the abort in the store: {}",
                     options_.name, rank(), size(), e.what());
    }
  }
  if (shm_ != nullptr) shm_->abort_members();  // the peers' waits are not on sockets
  abort_transport();
}

bool ProcessGroup::failed() const { return aborted_.load() || queue_->broken(); }

int ProcessGroup::aborted_by() {
  if (aborted_.load()) return rank();
  if (size() == 1) return -1;
  try {
    const std::string key = aborted_key(options_.key_prefix);
    if (!options_.store->check({key})) return -1;
    return std::stoi(to_string(options_.store->get(key, options_.timeout)));
  } catch (const std::exception&) {
    return -1;
  }
}

void ProcessGroup::abort_transport() {
  if (shm_ != nullptr) shm_->abort();
  if (two_level_ != nullptr) two_level_->abort();
  if (context_ != nullptr) {
    hsgd::detail::abort_gloo_connections(*context_, *options_.store, options_.key_prefix);
  }
}

std::exception_ptr ProcessGroup::on_failure(const CollectiveFingerprint& fp,
                                            const std::exception& e) {
  // Found by this rank's watchdog, or by a peer's, which then shut the connections down.
  std::shared_ptr<const hsgd::detail::MismatchReport> mismatch =
      watchdog_ != nullptr ? watchdog_->found() : nullptr;
  if (mismatch == nullptr && size() > 1) {
    mismatch = hsgd::detail::stored_mismatch(*options_.store, options_.key_prefix, rank());
  }
  if (mismatch != nullptr) {
    const std::string message = str_cat(fp.describe(), " of group '", options_.name, "' (rank ",
                                        rank(), " of ", size(), ") failed: ", mismatch->message);
    return std::make_exception_ptr(CollectiveMismatch(message, mismatch->same_ranks));
  }
  if (const int by = aborted_by(); by >= 0) {
    // The cause is known: no need to ask the members what they were doing.
    return std::make_exception_ptr(
        CommError(str_cat(fp.describe(), " of group '", options_.name, "' (rank ", rank(), " of ",
                          size(), ") failed: the group was aborted by rank ", by,
                          " (ProcessGroup::abort). Cause: ", e.what())));
  }
  const bool timed_out = looks_like_timeout(e.what());
  const Duration grace =
      std::min<Duration>(options_.timeout / 2, timed_out ? options_.diagnosis_grace_after_timeout
                                                         : options_.diagnosis_grace_after_loss);
  const std::string who =
      grace.count() > 0 ? diagnose_failure(fp, grace)
                        : std::string("the other members were not asked what they were doing");
  const std::string message =
      str_cat(fp.describe(), " of group '", options_.name, "' (rank ", rank(), " of ", size(), ") ",
              timed_out ? "timed out after " + std::to_string(options_.timeout.count()) + " ms"
                        : std::string("failed"),
              ": ", who, ". Cause: ", e.what());
  logger()->error("{}", message);
  return timed_out ? std::make_exception_ptr(Timeout(message))
                   : std::make_exception_ptr(CommError(message));
}

// Costs nothing on the fast path: only a rank whose collective failed writes
// "<prefix>failed/<rank>" (once: a group fails once), holding the description of the collective
// it is in, and waits a grace period for the other members to do the same. Ranks blocked in a
// collective of this group fail too (their peers never answer) and write theirs, whichever
// collective it is; a rank whose key never appears was not in a collective of this group (still
// computing, waiting elsewhere) or is dead. After a timeout the others time out about as late,
// so the grace is half the timeout, at most 30 s; after a lost connection or a peer that exited,
// the others fail within moments, and a dead peer never reports, so 2 s (both are options).
Duration ProcessGroup::work_timeout() const {
  // diagnose_failure: a store barrier and a read, each bounded by the grace (at most 30 s).
  return options_.timeout + std::min<Duration>(options_.timeout, std::chrono::seconds(60)) +
         std::chrono::seconds(5);
}

std::string ProcessGroup::diagnose_failure(const CollectiveFingerprint& fp, Duration grace) {
  const std::string base = options_.key_prefix + "failed/";
  try {
    bool everyone = true;
    try {
      store_barrier(*options_.store, base, rank(), size(), grace,
                    {.value = to_bytes(fp.describe())});
    } catch (const Timeout&) {
      everyone = false;
    }
    const std::vector<int> missing =
        everyone ? std::vector<int>{} : store_barrier_missing(*options_.store, base, size());
    std::vector<std::string> keys;
    std::vector<int> reported;
    for (int r = 0, m = 0; r < size(); ++r) {
      if (m < static_cast<int>(missing.size()) && missing[static_cast<size_t>(m)] == r) {
        ++m;
        continue;
      }
      keys.push_back(base + std::to_string(r));
      reported.push_back(r);
    }
    std::vector<std::string> reports;
    for (const Bytes& value : options_.store->multi_get(keys, grace)) {
      reports.push_back(to_string(value));
    }
    const std::vector<RanksWithValue> doing = group_ranks_by_value(reports, reported);
    if (missing.empty() && doing.size() == 1) {
      return "every rank reached this collective and failed (a network failure, or a peer that "
             "exited)";
    }
    std::string out;
    for (const auto& [what, ranks] : doing) {
      if (!out.empty()) out += "; ";
      out += detail::describe_rank_set(ranks);
      out += ranks.size() == 1 ? " is in " : " are in ";
      out += what;
    }
    if (!missing.empty()) {
      std::vector<int> missing_global;
      for (int r : missing) missing_global.push_back(options_.ranks[static_cast<size_t>(r)]);
      out += str_cat(out.empty() ? "" : "; ", "ranks ", detail::format_ranks(missing), " (global ",
                     detail::format_ranks(missing_global),
                     ") did not arrive (no failure report from them within ", grace.count(),
                     " ms: not in a collective of this group, or dead)");
    }
    return out;
  } catch (const std::exception& e) {
    return std::string("could not ask the store what the other ranks are doing: ") + e.what();
  }
}

void ProcessGroup::shutdown(Duration timeout) {
  // Members still waiting in a collective from this seq on wait for a rank that left: their
  // watchdogs read this key and fail at once.
  const uint64_t left_at = queue_->next_seq();
  auto last = enqueue({.kind = "shutdown drain"}, RunOn::kWorker, [](uint32_t) {});
  queue_->close();
  try {
    last->wait(timeout);
  } catch (const Timeout&) {
    throw;
  } catch (const Error&) {
    // A broken group: its earlier failure was reported to whoever waited on it. Still meet the
    // peers, so the live ones do not exit under each other.
  }
  if (size() > 1) {
    options_.store->set(hsgd::detail::CollectiveWatchdog::left_key(options_.key_prefix, rank()),
                        to_bytes(std::to_string(left_at)));
  }
  const std::string what = str_cat("ProcessGroup::shutdown of group '", options_.name, "' (rank ",
                                   rank(), " of ", size(), ")");
  // Waits in slices of the mismatch threshold: a member that waits in a collective this rank
  // will never join stores a mismatch report (its watchdog read the key above); then this rank
  // fails within seconds too instead of at the timeout.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const Duration slice = options_.mismatch_check.count() > 0 && size() > 1
                             ? std::max<Duration>(options_.mismatch_check, Duration(100))
                             : timeout;
  while (true) {
    const auto left =
        std::chrono::duration_cast<Duration>(deadline - std::chrono::steady_clock::now());
    try {
      store_barrier(*options_.store, options_.key_prefix + "shutdown/", rank(), size(),
                    std::max<Duration>(std::min(slice, left), Duration(1)), {.what = what});
      wait_until_peers_left_store(what, deadline);
      return;
    } catch (const Timeout&) {
      if (std::chrono::steady_clock::now() >= deadline) throw;
    }
    HSGD_CHECK_AS(CommError, !aborted_.load(), what, ": the group was aborted meanwhile");
    if (auto mismatch =
            hsgd::detail::stored_mismatch(*options_.store, options_.key_prefix, rank())) {
      throw CollectiveMismatch(str_cat(what,
                                       ": another member waits in a collective this rank "
                                       "left: ",
                                       mismatch->message),
                               mismatch->same_ranks);
    }
  }
}

void ProcessGroup::wait_until_peers_left_store(const std::string& what,
                                               std::chrono::steady_clock::time_point deadline) {
  if (size() == 1) return;
  // A member that left the barrier above may still be reading its keys; the member hosting the
  // store (an embedded rendezvous server in options_.resources) must not take it away before
  // every member is done with it, or that member would wait for a server that is gone.
  const std::string done = options_.key_prefix + "shutdown_done/";
  options_.store->set(done + std::to_string(rank()), to_bytes("1"));
  if (options_.resources == nullptr) return;
  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r) keys.push_back(done + std::to_string(r));
  const auto left =
      std::chrono::duration_cast<Duration>(deadline - std::chrono::steady_clock::now());
  try {
    options_.store->wait(keys, std::max<Duration>(left, Duration(1)));
  } catch (const Timeout& e) {
    logger()->warn("{}: not every member confirmed it left the store it hosts: {}", what,
                   e.what());
  }
}

}  // namespace hsgd::comm
