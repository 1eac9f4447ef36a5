#include "comm/process_group/detail/gloo_allreduce.h"

#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/context.h>
#include <gloo/math.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/address.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <list>
#include <map>
#include <tuple>
#include <vector>

#include "comm/process_group/detail/direct_allreduce.h"

// ---- algorithm choice (kAuto) ----
// Pinned algorithms (DirectExchange and DirectScatterGather of direct_allreduce.h,
// gloo::AllreduceRing, AllreduceHalvingDoubling, AllreduceRingChunked): the sender writes
// straight into a slot the receiver registered once, no per-message handshake, so they win while
// latency dominates. Each is built once per (type, count, op) and cached; halving-doubling and
// ring-chunked register a group-owned buffer, into and out of which the caller's data is copied;
// the direct algorithms and the pinned ring register only buffers of their own and take the
// caller's buffer at each call (CallerBufferAlgorithm). Above kSmallAllreduceBytes:
// gloo::allreduce's ring (kRing) on the caller's memory: no copy, no cached state, 2 (p-1)/p of
// the data per link, segments pipelined, but a receive-ready round trip per segment, which costs
// milliseconds at small sizes.
//
// Steps in sequence: direct exchange 1 (the whole buffer to every peer at once), pinned ring
// p - 1 (each carries the whole buffer and waits for a notification back), halving-doubling
// 2 log2(p). Every rank must end with the same bits (replicas must stay identical;
// shm_allreduce_test checks it): the direct exchange sums the buffers in rank order on every
// rank, halving-doubling reduces each element on one rank and sends it to the others; the pinned
// ring does not (each rank sums in its own order, equal only on 2 ranks, where a + b = b + a), so
// kAuto never picks it. The thresholds (process_group.h) come from apps/bench/allreduce_bench
// --tcp-algorithms; its tables are in docs/benchmarks.md, "Allreduce".

namespace hsgd::detail {

using comm::AllreduceAlgorithm;
using comm::ReduceOp;

namespace {

template <typename T>
using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename T>
ReduceFn<T> reduce_fn(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin:
      return &gloo::min<T>;
    case ReduceOp::kMax:
      return &gloo::max<T>;
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      break;
  }
  return &gloo::sum<T>;
}

template <typename T>
const gloo::ReductionFunction<T>* reduction_function(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin:
      return gloo::ReductionFunction<T>::min;
    case ReduceOp::kMax:
      return gloo::ReductionFunction<T>::max;
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      break;
  }
  return gloo::ReductionFunction<T>::sum;
}

std::atomic<int> sizings_run{0};  // calls of size_send_buffers in this process

// The bytes a cached algorithm for a buffer of `bytes` holds: DirectExchange every rank's buffer
// twice (two sets of inboxes), DirectScatterGather its two inboxes twice, the others one buffer.
size_t held_bytes(AllreduceAlgorithm algorithm, size_t bytes, int ranks) {
  if (algorithm == AllreduceAlgorithm::kDirect) return 2 * static_cast<size_t>(ranks) * bytes;
  if (algorithm == AllreduceAlgorithm::kDirectScatter) return 4 * bytes;
  return bytes;
}

// Whether the context's pairs are Gloo's TCP transport (not hsgd's TLS one).
bool over_gloo_tcp(gloo::Context& context) {
  return context.size < 2 || dynamic_cast<const gloo::transport::tcp::Address*>(
                                 &context.getPair(context.rank == 0 ? 1 : 0)->address()) != nullptr;
}

}  // namespace

AllreduceAlgorithm choose_gloo_algorithm(AllreduceAlgorithm requested, size_t count,
                                         size_t element_bytes, int ranks) {
  const size_t bytes = count * element_bytes;
  AllreduceAlgorithm algorithm = requested;
  if (algorithm == AllreduceAlgorithm::kAuto) {
    if (bytes > comm::kSmallAllreduceBytes) {
      algorithm = AllreduceAlgorithm::kRing;
    } else if (static_cast<size_t>(ranks - 1) * bytes <= comm::kDirectAllreduceBytes) {
      algorithm = AllreduceAlgorithm::kDirect;
    } else {
      algorithm = AllreduceAlgorithm::kDirectScatter;
    }
  }
  if (held_bytes(algorithm, bytes, ranks) > comm::kAllreduceCacheBytes ||
      count > static_cast<size_t>(std::numeric_limits<int>::max())) {
    algorithm = AllreduceAlgorithm::kRing;
  }
  return algorithm;
}

namespace {

// Sends one byte to each rank of `to` and returns once one byte came from each rank of `from`,
// under a new slot. Unbound messages wait at their receiver without blocking its pair, so they can
// tell a peer that this rank registered a slot before any pinned message goes into it. Bounded
// by timeout; throws Gloo's exception.
void exchange_ready(gloo::Context& context, const std::vector<int>& to,
                    const std::vector<int>& from, comm::Duration timeout) {
  const auto slot = static_cast<uint64_t>(context.nextSlot());
  char ready = 1;
  std::vector<char> received(static_cast<size_t>(context.size), 0);
  auto send = context.createUnboundBuffer(&ready, 1);
  auto recv = context.createUnboundBuffer(received.data(), received.size());
  for (const int r : to) send->send(r, slot);
  for (const int r : from) recv->recv(r, slot, static_cast<size_t>(r), 1);
  for (size_t i = 0; i < from.size(); ++i) recv->waitRecv(timeout);
  for (size_t i = 0; i < to.size(); ++i) send->waitSend(timeout);
}

// Sizes the send buffer of every pair, so that large transfers never go through a small socket
// buffer. Gloo's TCP pair sets SO_SNDBUF to the size of the first message sent from a pinned
// buffer (the algorithms of the cache) and raises it only for larger ones, which turns off Linux's
// send-buffer autotuning for the pair for good. A small first pinned message (a 4-byte allreduce
// of metrics) leaves a buffer of a few KB for every later large transfer from unbound buffers (the
// ring allreduce, broadcast, allgather, the ring exchange), which Gloo never resizes; each of their
// many hand-offs between the two ranks' Gloo threads waits for a time slice when ranks
// oversubscribe the cores (apps/bench/ddp_bench shows the cost). The kPinnedSendBytes exchange
// here is a pinned message, which fixes the send buffer at min(2 x kPinnedSendBytes, 2 x
// net.core.wmem_max), and it opens the receivers' windows (SO_SNDBUF set on the sockets alone
// leaves allreduces of 64-256 KiB on 8 ranks 20-40% slower in apps/bench/allreduce_bench).
//
// It runs once per context, before the first transfer of more than kUnsizedBytes after a pinned
// message (GlooAllreduce::prepare), not when the group connects: a group that never allreduces
// through the cache (a group of node leaders that only runs ring_exchange) keeps autotuning, and
// a group whose pinned messages stay small (the epoch's metrics on the world's groups) never
// pays its 1 MiB per pair of ranks, which across a slow link can cost more than the messages
// themselves. The calls that lead to it are collective, so the exchange is too. Ranks go around
// the ring by distance (send to rank + d, receive from rank - d) so that one send and one receive
// buffer are alive at a time. Waits are bounded by timeout (the group's) and end at once when the
// collective watchdog aborts the group.
void size_send_buffers(gloo::Context& context, comm::Duration timeout) {
  sizings_run.fetch_add(1, std::memory_order_relaxed);
  const int rank = context.rank, n = context.size;
  constexpr size_t kPinnedSendBytes = size_t{1} << 20;
  std::vector<char> out(kPinnedSendBytes, 0);
  std::vector<char> in(kPinnedSendBytes, 0);
  for (int d = 1; d < n; ++d) {
    const int slot = context.nextSlot();
    const int to = (rank + d) % n;
    const int from = (rank - d + n) % n;
    auto recv = context.getPair(from)->createRecvBuffer(slot, in.data(), in.size());
    // The pinned message goes out only once `to` registered its slot: one that reaches a pair
    // before would stop it from reading anything else (see confirm_peers_registered), for good
    // if `to` is in another collective.
    exchange_ready(context, {from}, {to}, timeout);
    auto send = context.getPair(to)->createSendBuffer(slot, out.data(), out.size());
    send->send(0, out.size());
    recv->waitRecv();
    send->waitSend();
  }
}

}  // namespace

// Returns once every peer has registered the buffers of the algorithm just built (each rank
// calls it right after building its own). A pinned message that reaches a pair before its slot is
// registered stops that pair from reading anything else, the end of its socket included, until
// the slot is registered: if a peer never builds the algorithm (the ranks called different
// collectives), that peer could neither receive its own collective's messages nor notice the
// shutdown by which the collective watchdog aborts the group (exchange_ready's unbound messages
// do not stop it). Bounded by timeout; throws Gloo's exception.
void confirm_peers_registered(gloo::Context& context, comm::Duration timeout) {
  std::vector<int> peers;
  for (int r = 0; r < context.size; ++r) {
    if (r != context.rank) peers.push_back(r);
  }
  exchange_ready(context, peers, peers, timeout);
}

// gloo::AllreduceRing on the caller's buffer (kPinnedRing without hsgd's copy in and out): the
// ring registers only its own inbox and outbox with the pairs and touches ptrs_[0] through memcpy
// and the reduction within run(), so ptrs_[0] can point at each call's data.
template <typename T>
class CallerBufferRing : public CallerBufferAlgorithm<T> {
 public:
  CallerBufferRing(const std::shared_ptr<gloo::Context>& context, const std::vector<T*>& ptrs,
                   int count, const gloo::ReductionFunction<T>* fn)
      : CallerBufferAlgorithm<T>(context), ring_(context, ptrs, count, fn) {}
  void run_on(T* data) override { ring_.reduce(data); }

 private:
  class Ring : public gloo::AllreduceRing<T> {
   public:
    using gloo::AllreduceRing<T>::AllreduceRing;
    void reduce(T* data) {
      this->ptrs_[0] = data;
      this->run();
      this->ptrs_[0] = nullptr;  // never read outside reduce
    }
  };
  Ring ring_;
};

// Gloo algorithm objects with the buffer they reduce, least recently used evicted first. The
// sequence of (type, count, op) is the same on every rank (the group contract), so hits, misses
// and evictions, and with them Gloo's slot numbers, agree across ranks.
class GlooAllreduce::Cache {
 public:
  struct Entry {
    // The buffer the algorithm reduces (double keeps alignment); empty for the
    // CallerBufferAlgorithms (kPinnedRing, kDirect, kDirectScatter), which reduce the caller's.
    std::vector<double> storage;
    std::unique_ptr<gloo::Algorithm> algorithm;
    size_t bytes = 0;
  };

  // The entry for (T, count, op, algorithm), built on a miss (which is collective: every rank
  // misses at the same call); timeout bounds the messages a miss exchanges.
  template <typename T>
  Entry& get(const std::shared_ptr<gloo::Context>& context, size_t count, ReduceOp op,
             AllreduceAlgorithm algorithm, comm::Duration timeout) {
    const ReduceOp algo_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    const Key key{sizeof(T) == 4 ? 'f' : 'd', count, algo_op, algorithm};
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.first);
      return it->second.second;
    }
    const size_t bytes = held_bytes(algorithm, count * sizeof(T), context->size);
    while (!lru_.empty() &&
           (entries_.size() >= kMaxEntries || total_bytes_ + bytes > comm::kAllreduceCacheBytes)) {
      auto victim = entries_.find(lru_.back());
      total_bytes_ -= victim->second.second.bytes;
      entries_.erase(victim);
      lru_.pop_back();
    }
    Entry entry;
    entry.bytes = bytes;
    if (algorithm == AllreduceAlgorithm::kHalvingDoubling ||
        algorithm == AllreduceAlgorithm::kRingChunked) {
      entry.storage.resize((bytes + sizeof(double) - 1) / sizeof(double) + 1);
    }
    const std::vector<T*> ptrs{reinterpret_cast<T*>(entry.storage.data())};
    const int n = static_cast<int>(count);
    if (algorithm == AllreduceAlgorithm::kHalvingDoubling) {
      entry.algorithm = std::make_unique<gloo::AllreduceHalvingDoubling<T>>(
          context, ptrs, n, reduction_function<T>(algo_op));
    } else if (algorithm == AllreduceAlgorithm::kPinnedRing) {
      entry.algorithm =
          std::make_unique<CallerBufferRing<T>>(context, ptrs, n, reduction_function<T>(algo_op));
    } else if (algorithm == AllreduceAlgorithm::kDirect) {
      entry.algorithm =
          std::make_unique<DirectExchange<T>>(context, count, reduction_function<T>(algo_op));
    } else if (algorithm == AllreduceAlgorithm::kDirectScatter) {
      entry.algorithm =
          std::make_unique<DirectScatterGather<T>>(context, count, reduction_function<T>(algo_op));
    } else {
      entry.algorithm = std::make_unique<gloo::AllreduceRingChunked<T>>(
          context, ptrs, n, reduction_function<T>(algo_op));
    }
    confirm_peers_registered(*context, timeout);
    lru_.push_front(key);
    total_bytes_ += bytes;
    return entries_.emplace(key, std::make_pair(lru_.begin(), std::move(entry)))
        .first->second.second;
  }

 private:
  using Key = std::tuple<char, size_t, ReduceOp, AllreduceAlgorithm>;
  static constexpr size_t kMaxEntries = 64;
  size_t total_bytes_ = 0;
  std::list<Key> lru_;  // most recent first
  std::map<Key, std::pair<std::list<Key>::iterator, Entry>> entries_;
};

GlooAllreduce::GlooAllreduce(std::shared_ptr<gloo::Context> context, comm::Duration timeout)
    : context_(std::move(context)), timeout_(timeout), cache_(std::make_unique<Cache>()) {}

GlooAllreduce::~GlooAllreduce() = default;

template <typename T>
void GlooAllreduce::allreduce_impl(std::span<T> data, ReduceOp op, AllreduceAlgorithm requested,
                                   uint32_t tag) {
  const AllreduceAlgorithm algorithm =
      choose_gloo_algorithm(requested, data.size(), sizeof(T), context_->size);
  prepare(data.size_bytes(), algorithm != AllreduceAlgorithm::kRing);
  if (algorithm == AllreduceAlgorithm::kPinnedRing || algorithm == AllreduceAlgorithm::kDirect ||
      algorithm == AllreduceAlgorithm::kDirectScatter) {
    auto& entry = cache_->get<T>(context_, data.size(), op, algorithm, timeout_);
    static_cast<CallerBufferAlgorithm<T>&>(*entry.algorithm).run_on(data.data());
  } else if (algorithm != AllreduceAlgorithm::kRing) {
    auto& entry = cache_->get<T>(context_, data.size(), op, algorithm, timeout_);
    T* buffer = reinterpret_cast<T*>(entry.storage.data());
    std::copy(data.begin(), data.end(), buffer);
    entry.algorithm->run();
    std::copy(buffer, buffer + data.size(), data.begin());
  } else {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data.data(), data.size());
    opts.setReduceFunction(reduce_fn<T>(op));
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::allreduce(opts);
  }
  if (op == ReduceOp::kAvg) {
    const T n = static_cast<T>(context_->size);
    for (auto& x : data) x /= n;
  }
}

void GlooAllreduce::prepare(size_t bytes, bool pinned) {
  // Only Gloo's TCP pairs fix their send buffers; hsgd's TLS pairs leave them to the kernel.
  if (!send_buffers_sized_ && (pinned || pinned_used_) && bytes > kUnsizedBytes &&
      over_gloo_tcp(*context_)) {
    size_send_buffers(*context_, timeout_);
    send_buffers_sized_ = true;
  }
  pinned_used_ = pinned_used_ || pinned;
}

void GlooAllreduce::allreduce(std::span<float> data, ReduceOp op, AllreduceAlgorithm requested,
                              uint32_t tag) {
  allreduce_impl(data, op, requested, tag);
}

void GlooAllreduce::allreduce(std::span<double> data, ReduceOp op, AllreduceAlgorithm requested,
                              uint32_t tag) {
  allreduce_impl(data, op, requested, tag);
}

int send_buffer_sizings() { return sizings_run.load(std::memory_order_relaxed); }

}  // namespace hsgd::detail
