#include "comm/process_group/process_group.h"

#include <gloo/allgather.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>

#include "comm/error.h"
#include "comm/format_ranks.h"
#include "comm/log.h"
#include "comm/process_group/detail/collective_fingerprint.h"
#include "comm/process_group/detail/collective_queue.h"
#include "comm/process_group/detail/gloo_allreduce.h"
#include "comm/process_group/detail/two_level_allreduce.h"
#include "comm/process_group/shm_allreduce.h"
#include "comm/store/gloo_store.h"
#include "comm/store/store_barrier.h"

// The parts of a group live in comm/detail: the collective queue and its worker thread
// (collective_queue), the Gloo allreduce algorithms and their cache (gloo_allreduce), the
// two-level allreduce across nodes (two_level_allreduce) and child group creation
// (child_group). This file connects a group and queues its collectives.

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
  }
  return "?";
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
  HSGD_CHECK(options_.node_rank >= -1, "ProcessGroup '", options_.name, "': node_rank ",
             options_.node_rank, " must be >= 0, or -1 (not declared)");
  connect();
  queue_ = std::make_unique<hsgd::detail::CollectiveQueue>(
      options_.name, options_.timeout,
      [this](const CollectiveFingerprint& fp, const std::exception& e) {
        return on_failure(fp, e);
      });
}

ProcessGroup::~ProcessGroup() {
  queue_.reset();  // runs the collectives still queued, then stops the worker
  // Algorithms hold buffers registered with the context's pairs: destroy them first.
  gloo_allreduce_.reset();
}

void ProcessGroup::connect() {
  // Everyone announces itself first, so that a missing rank is named ("ranks [3] did not
  // arrive") instead of surfacing as an anonymous Gloo store timeout.
  // The value is this rank's node identity when the group may use shared memory.
  const bool try_shm = options_.shared_memory && size() > 1 && size() <= ShmAllreduce::kMaxRanks;
  const std::string arrived = options_.key_prefix + "arrived/";
  store_barrier(*options_.store, arrived, rank(), size(), options_.timeout,
                {.value = to_bytes(try_shm ? node_identity() : std::string("1")),
                 .what = detail::str_cat("ProcessGroup '", options_.name, "' (rank ", rank(),
                                         " of ", size(), ")"),
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
  context_ = std::move(context);
  gloo_allreduce_ = std::make_unique<hsgd::detail::GlooAllreduce>(context_, options_.timeout);
  if (try_shm) {
    const auto nodes =
        options_.store->multi_get(store_barrier_keys(arrived, size()), options_.timeout);
    const bool one_node = std::all_of(nodes.begin(), nodes.end(),
                                      [&](const Bytes& node) { return node == nodes.front(); });
    if (one_node) {
      shm_ = ShmAllreduce::connect(*options_.store, options_.key_prefix + "shm/", rank(), size(),
                                   options_.timeout, options_.name);
    } else {
      two_level_ = hsgd::detail::TwoLevelAllreduce::connect(options_, nodes);
    }
  }
  logger()->debug("rank {} of group '{}' connected ({} ranks, prefix '{}', allreduce over {})",
                  rank(), options_.name, size(), options_.key_prefix,
                  shm_         ? "shared memory"
                  : two_level_ ? "shared memory within nodes and TCP between them"
                               : "TCP");
}

std::shared_ptr<Work> ProcessGroup::enqueue(CollectiveFingerprint fp,
                                            std::function<void(uint32_t tag)> run) {
  std::weak_ptr<ProcessGroup> self = weak_from_this();
  return queue_->enqueue(std::move(fp), std::move(run), [self](const Work& w, Duration timeout) {
    if (auto group = self.lock()) group->queue_->help(w, timeout);
  });
}

std::exception_ptr ProcessGroup::on_failure(const CollectiveFingerprint& fp,
                                            const std::exception& e) {
  const bool timed_out = looks_like_timeout(e.what());
  const std::string who = diagnose_failure(fp, timed_out);
  const std::string message = detail::str_cat(
      fp.describe(), " of group '", options_.name, "' (rank ", rank(), " of ", size(), ") ",
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
// the others fail within moments, and a dead peer never reports, so 2 s.
Duration ProcessGroup::work_timeout() const {
  // diagnose_failure: a store barrier and a read, each bounded by the grace (at most 30 s).
  return options_.timeout + std::min<Duration>(options_.timeout, std::chrono::seconds(60)) +
         std::chrono::seconds(5);
}

std::string ProcessGroup::diagnose_failure(const CollectiveFingerprint& fp, bool timed_out) {
  const Duration grace =
      std::min<Duration>(options_.timeout / 2, timed_out ? Duration(std::chrono::seconds(30))
                                                         : Duration(std::chrono::seconds(2)));
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
    const std::vector<Bytes> values = options_.store->multi_get(keys, grace);
    // The ranks of each distinct report, in the order of their lowest rank.
    std::vector<std::pair<std::string, std::vector<int>>> doing;
    for (size_t i = 0; i < values.size(); ++i) {
      const std::string what = to_string(values[i]);
      auto it =
          std::find_if(doing.begin(), doing.end(), [&](const auto& d) { return d.first == what; });
      if (it == doing.end()) {
        doing.push_back({what, {reported[i]}});
      } else {
        it->second.push_back(reported[i]);
      }
    }
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
      out += detail::str_cat(out.empty() ? "" : "; ", "ranks ", detail::format_ranks(missing),
                             " (global ", detail::format_ranks(missing_global),
                             ") did not arrive (no failure report from them within ", grace.count(),
                             " ms: not in a collective of this group, or dead)");
    }
    return out;
  } catch (const std::exception& e) {
    return std::string("could not ask the store what the other ranks are doing: ") + e.what();
  }
}

void ProcessGroup::shutdown(Duration timeout) {
  auto last = enqueue({.kind = "shutdown drain"}, [](uint32_t) {});
  queue_->close();
  try {
    last->wait(timeout);
  } catch (const Timeout&) {
    throw;
  } catch (const Error&) {
    // A broken group: its earlier failure was reported to whoever waited on it. Still meet the
    // peers, so the live ones do not exit under each other.
  }
  store_barrier(*options_.store, options_.key_prefix + "shutdown/", rank(), size(), timeout,
                {.what = detail::str_cat("ProcessGroup::shutdown of group '", options_.name,
                                         "' (rank ", rank(), " of ", size(), ")")});
}

// ---- collectives ----

template <typename T>
std::shared_ptr<Work> ProcessGroup::allreduce_impl(std::span<T> data, ReduceOp op, const char* type,
                                                   std::string_view label) {
  CollectiveFingerprint fp{
      .kind = "allreduce", .dtype = type, .count = data.size(), .args = to_string(op)};
  fp.label = label;
  return enqueue(std::move(fp), [this, data, op](uint32_t tag) {
    if (size() == 1 || data.empty()) return;
    const AllreduceAlgorithm algorithm = options_.allreduce_algorithm;
    if (algorithm == AllreduceAlgorithm::kAuto && shm_ != nullptr) {
      shm_->allreduce(data, op, std::chrono::steady_clock::now() + options_.timeout);
    } else if (algorithm == AllreduceAlgorithm::kAuto && two_level_ != nullptr) {
      two_level_->allreduce(data, op);
    } else {
      gloo_allreduce_->allreduce(data, op, algorithm, tag);
    }
  });
}

std::shared_ptr<Work> ProcessGroup::allreduce(std::span<float> data, ReduceOp op,
                                              std::string_view label) {
  return allreduce_impl(data, op, "float", label);
}

std::shared_ptr<Work> ProcessGroup::allreduce(std::span<double> data, ReduceOp op,
                                              std::string_view label) {
  return allreduce_impl(data, op, "double", label);
}

template <typename T>
std::shared_ptr<Work> ProcessGroup::broadcast_impl(std::span<T> data, int root, const char* type,
                                                   std::string_view label) {
  HSGD_CHECK(root >= 0 && root < size(), "ProcessGroup '", name(), "': broadcast root ", root,
             " must be a rank of the group, in [0, ", size(), ")");
  CollectiveFingerprint fp{.kind = "broadcast",
                           .dtype = type,
                           .count = data.size(),
                           .args = "root " + std::to_string(root)};
  fp.label = label;
  return enqueue(std::move(fp), [this, data, root](uint32_t tag) {
    if (size() == 1 || data.empty()) return;
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(data.data(), data.size());
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    gloo::broadcast(opts);
  });
}

std::shared_ptr<Work> ProcessGroup::broadcast(std::span<float> data, int root,
                                              std::string_view label) {
  return broadcast_impl(data, root, "float", label);
}
std::shared_ptr<Work> ProcessGroup::broadcast(std::span<double> data, int root,
                                              std::string_view label) {
  return broadcast_impl(data, root, "double", label);
}
std::shared_ptr<Work> ProcessGroup::broadcast(std::span<int64_t> data, int root,
                                              std::string_view label) {
  return broadcast_impl(data, root, "int64", label);
}

template <typename T>
std::shared_ptr<Work> ProcessGroup::allgather_impl(std::span<const T> in, std::span<T> out,
                                                   const char* type, std::string_view label) {
  HSGD_CHECK(out.size() == in.size() * static_cast<size_t>(size()), "ProcessGroup '", name(),
             "': allgather output has ", out.size(),
             " elements; expected size() * input = ", size(), " * ", in.size());
  CollectiveFingerprint fp{.kind = "allgather", .dtype = type, .count = in.size()};
  fp.label = label;
  return enqueue(std::move(fp), [this, in, out](uint32_t tag) {
    if (size() == 1 || in.empty()) {
      std::copy(in.begin(), in.end(), out.begin());
      return;
    }
    gloo::AllgatherOptions opts(context_);
    opts.setInput(const_cast<T*>(in.data()), in.size());  // Gloo only reads the input
    opts.setOutput(out.data(), out.size());
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    gloo::allgather(opts);
  });
}

std::shared_ptr<Work> ProcessGroup::allgather(std::span<const float> in, std::span<float> out,
                                              std::string_view label) {
  return allgather_impl(in, out, "float", label);
}
std::shared_ptr<Work> ProcessGroup::allgather(std::span<const int64_t> in, std::span<int64_t> out,
                                              std::string_view label) {
  return allgather_impl(in, out, "int64", label);
}

// Gloo's collectives use slot prefixes 0x01-0x08 (gloo/types.h); the ring exchange its own.
constexpr uint8_t kRingExchangeSlotPrefix = 0x21;

std::shared_ptr<Work> ProcessGroup::ring_exchange(std::span<const int64_t> send,
                                                  std::span<int64_t> recv, std::string_view label) {
  HSGD_CHECK(send.size() == recv.size(), "ProcessGroup '", name(), "': ring_exchange sends ",
             send.size(), " elements but receives ", recv.size(), "; expected the same count");
  CollectiveFingerprint fp{.kind = "ring exchange", .dtype = "int64", .count = send.size()};
  fp.label = label;
  return enqueue(std::move(fp), [this, send, recv](uint32_t tag) {
    if (size() == 1 || send.empty()) {
      std::copy(send.begin(), send.end(), recv.begin());
      return;
    }
    const int right = (rank() + 1) % size();
    const int left = (rank() + size() - 1) % size();
    // Gloo only reads a buffer it sends.
    auto out = context_->createUnboundBuffer(const_cast<int64_t*>(send.data()), send.size_bytes());
    auto in = context_->createUnboundBuffer(recv.data(), recv.size_bytes());
    const uint64_t slot = gloo::Slot::build(kRingExchangeSlotPrefix, tag);
    in->recv(left, slot);  // posted first, so the left neighbour's message has a place to land
    out->send(right, slot);
    const bool received = in->waitRecv(options_.timeout);
    const bool sent = out->waitSend(options_.timeout);
    if (!received || !sent) {
      HSGD_THROW(CommError, "ProcessGroup '", name(), "': ring exchange aborted (received ",
                 received, ", sent ", sent, ")");
    }
  });
}

std::shared_ptr<Work> ProcessGroup::barrier(std::string_view label) {
  CollectiveFingerprint fp{.kind = "barrier"};
  fp.label = label;
  return enqueue(std::move(fp), [this](uint32_t tag) {
    if (size() == 1) return;
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    gloo::barrier(opts);
  });
}

}  // namespace hsgd::comm
