#include "comm/process_group.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>

#include <algorithm>
#include <limits>
#include <list>
#include <map>
#include <tuple>

#include "comm/detail/format_ranks.h"
#include "comm/error.h"
#include "comm/gloo_store.h"
#include "comm/log.h"
#include "comm/shm_allreduce.h"

// ---- algorithm choice (kAuto) ----
// Up to kSmallAllreduceBytes (1 MiB): Gloo's AllreduceHalvingDoubling, 2 log2(p) steps. It is a
// "pinned buffer" algorithm: the sender writes straight into a slot the receiver registered
// once, no per-message handshake, so it wins while latency dominates. It is built once per
// (type, count, op) over a group-owned buffer and cached; the caller's data is copied in and out
// (cheap at these sizes). Above 1 MiB: Gloo's gloo::allreduce ring (kRing) on the caller's
// memory: no copy, no cached state, 2 (p-1)/p of the data per link, segments pipelined.
// Measured with apps/bench/allreduce_bench and a 2-rank probe on this 2-core machine (loopback,
// medians, under a load average of 12-20 from parallel builds, so +-2x noise):
//   1 MiB, 2 ranks:  halving-doubling 0.50 ms, ring-chunked 0.73-1.1 ms, kRing 2.9-4.0 ms
//   16 MiB, 2 ranks: kRing 19-25 ms, halving-doubling 52-89 ms, ring-chunked 69-108 ms
//   16 MiB, 4 ranks: kRing 45-53 ms, halving-doubling 62-86 ms, ring-chunked 55-136 ms
// (kRing pays a receive-ready round trip per segment, which costs at 1 MiB and vanishes at
// 16 MiB, where the pinned algorithms' extra copies through their inboxes dominate instead.)

namespace hsgd::comm {

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

bool looks_like_timeout(const std::string& message) {
  return message.find("imed out") != std::string::npos ||
         message.find("imeout") != std::string::npos;
}

// Gloo's TCP pair sets SO_SNDBUF to the size of the first message sent from a pinned buffer
// (the halving-doubling and ring-chunked algorithms of the cache) and raises it only for larger
// ones. That turns off Linux's send-buffer autotuning for the pair for good, so a small first
// pinned message (DDP's last bucket: 20-40 KB) left the socket with a 20-40 KB send buffer, and
// every later large allreduce (the ring, which sends from unbound buffers and never resizes)
// went through it in dozens of hand-offs between the two ranks' Gloo threads. With the ranks
// oversubscribing the cores each hand-off waits for a time slice: ResNet-20 DDP at 4 ranks on 2
// cores took 830 ms a step, 390 ms with this (apps/bench/ddp_bench). So the first pinned
// message of every pair is a kPinnedSendBytes exchange here, which fixes the send buffer at
// min(2 x kPinnedSendBytes, 2 x net.core.wmem_max) before any collective runs. Ranks go around
// the ring by distance (send to rank + d, receive from rank - d) so that one send and one
// receive buffer are alive at a time. Waits are bounded by the context's timeout.
void size_send_buffers(gloo::Context& context, int rank, int n) {
  constexpr size_t kPinnedSendBytes = size_t{1} << 20;
  std::vector<char> out(kPinnedSendBytes, 0);
  std::vector<char> in(kPinnedSendBytes, 0);
  for (int d = 1; d < n; ++d) {
    const int slot = context.nextSlot();
    const int to = (rank + d) % n;
    const int from = (rank - d + n) % n;
    auto recv = context.getPair(from)->createRecvBuffer(slot, in.data(), in.size());
    auto send = context.getPair(to)->createSendBuffer(slot, out.data(), out.size());
    send->send(0, out.size());
    recv->waitRecv();
    send->waitSend();
  }
}

}  // namespace

// Gloo algorithm objects with the buffer they reduce, least recently used evicted first. The
// sequence of (type, count, op) is the same on every rank (the group contract), so hits, misses
// and evictions, and with them Gloo's slot numbers, agree across ranks.
struct ProcessGroup::AlgorithmCache {
  struct Entry {
    std::vector<double> storage;  // the buffer the algorithm reduces (double keeps alignment)
    std::unique_ptr<gloo::Algorithm> algorithm;
    size_t bytes = 0;
  };
  using Key = std::tuple<char, size_t, ReduceOp, AllreduceAlgorithm>;

  template <typename T>
  Entry& get(const std::shared_ptr<gloo::Context>& context, size_t count, ReduceOp op,
             AllreduceAlgorithm algorithm) {
    const ReduceOp algo_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    const Key key{sizeof(T) == 4 ? 'f' : 'd', count, algo_op, algorithm};
    auto it = entries.find(key);
    if (it != entries.end()) {
      lru.splice(lru.begin(), lru, it->second.first);
      return it->second.second;
    }
    const size_t bytes = count * sizeof(T);
    while (!lru.empty() &&
           (entries.size() >= kMaxEntries || total_bytes + bytes > kAllreduceCacheBytes)) {
      auto victim = entries.find(lru.back());
      total_bytes -= victim->second.second.bytes;
      entries.erase(victim);
      lru.pop_back();
    }
    lru.push_front(key);
    Entry entry;
    entry.bytes = bytes;
    entry.storage.resize((bytes + sizeof(double) - 1) / sizeof(double) + 1);
    T* ptr = reinterpret_cast<T*>(entry.storage.data());
    const std::vector<T*> ptrs{ptr};
    const int n = static_cast<int>(count);
    if (algorithm == AllreduceAlgorithm::kHalvingDoubling) {
      entry.algorithm = std::make_unique<gloo::AllreduceHalvingDoubling<T>>(
          context, ptrs, n, reduction_function<T>(algo_op));
    } else {
      entry.algorithm = std::make_unique<gloo::AllreduceRingChunked<T>>(
          context, ptrs, n, reduction_function<T>(algo_op));
    }
    total_bytes += bytes;
    return entries.emplace(key, std::make_pair(lru.begin(), std::move(entry))).first->second.second;
  }

  static constexpr size_t kMaxEntries = 64;
  size_t total_bytes = 0;
  std::list<Key> lru;  // most recent first
  std::map<Key, std::pair<std::list<Key>::iterator, Entry>> entries;
};

ProcessGroup::ProcessGroup(Options options)
    : options_(std::move(options)), algorithm_cache_(std::make_unique<AlgorithmCache>()) {
  HSGD_CHECK(options_.store != nullptr, "ProcessGroup '", options_.name, "': a store is required");
  HSGD_CHECK(!options_.ranks.empty(), "ProcessGroup '", options_.name,
             "': ranks must not be empty");
  HSGD_CHECK(options_.rank >= 0 && options_.rank < size(), "ProcessGroup '", options_.name,
             "': rank ", options_.rank, " must be in [0, ", size(), ")");
  HSGD_CHECK(options_.timeout.count() > 0, "ProcessGroup '", options_.name, "': timeout ",
             options_.timeout.count(), " ms must be positive");
  HSGD_CHECK(size() == 1 || options_.device != nullptr, "ProcessGroup '", options_.name,
             "': a Gloo device is required for ", size(), " ranks");
  connect();
  worker_ = std::thread([this] { worker_loop(); });
}

ProcessGroup::~ProcessGroup() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
  // Algorithms hold buffers registered with the context's pairs: destroy them first.
  algorithm_cache_.reset();
}

void ProcessGroup::connect() {
  // Everyone announces itself first, so that a missing rank is named ("ranks [3] did not
  // arrive") instead of surfacing as an anonymous Gloo store timeout.
  // The value is this rank's node identity when the group may use shared memory.
  const bool try_shm = options_.shared_memory && size() > 1 && size() <= ShmAllreduce::kMaxRanks;
  const std::string arrived = options_.key_prefix + "arrived/";
  options_.store->set(arrived + std::to_string(rank()),
                      to_bytes(try_shm ? node_identity() : std::string("1")));
  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r) keys.push_back(arrived + std::to_string(r));
  try {
    options_.store->wait(keys, options_.timeout);
  } catch (const Timeout&) {
    std::vector<int> missing, missing_global;
    for (int r = 0; r < size(); ++r) {
      if (!options_.store->check({keys[static_cast<size_t>(r)]})) {
        missing.push_back(r);
        missing_global.push_back(options_.ranks[static_cast<size_t>(r)]);
      }
    }
    HSGD_THROW(Timeout, "ProcessGroup '", options_.name, "' (rank ", rank(), " of ", size(),
               "): ranks ", detail::format_ranks(missing), " (global ",
               detail::format_ranks(missing_global), ") did not arrive within ",
               options_.timeout.count(), " ms");
  }
  if (size() == 1) return;  // no peers: collectives are local

  auto context = std::make_shared<gloo::rendezvous::Context>(rank(), size());
  context->setTimeout(options_.timeout);
  auto gloo_store = as_gloo_store(options_.store, options_.key_prefix + "gloo/", options_.timeout);
  auto device = options_.device;
  try {
    context->connectFullMesh(*gloo_store, device);
    size_send_buffers(*context, rank(), size());
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    HSGD_THROW(CommError, "ProcessGroup '", options_.name, "' (rank ", rank(), " of ", size(),
               "): connecting to the other ranks failed: ", e.what());
  }
  context_ = std::move(context);
  if (try_shm) {
    const auto nodes = options_.store->multi_get(keys, options_.timeout);
    const bool one_node = std::all_of(nodes.begin(), nodes.end(),
                                      [&](const Bytes& node) { return node == nodes.front(); });
    if (one_node) {
      shm_ = ShmAllreduce::connect(*options_.store, options_.key_prefix + "shm/", rank(), size(),
                                   options_.timeout, options_.name);
    } else {
      connect_two_level(nodes);
    }
  }
  logger()->debug("rank {} of group '{}' connected ({} ranks, prefix '{}', allreduce over {})",
                  rank(), options_.name, size(), options_.key_prefix,
                  shm_         ? "shared memory"
                  : two_level_ ? "shared memory within nodes and TCP between them"
                               : "TCP");
}

// Members grouped by node (in order of their first group rank). The two-level allreduce needs
// at least two nodes with the same number L >= 2 of members each: then member i of a node
// (i-th lowest group rank there) joins "cross group" i, which holds member i of every node.
// Every rank computes the same plan from the same identities; whether every node could map
// its segment is agreed through the store, so either all ranks use the two-level allreduce or
// none does.
void ProcessGroup::connect_two_level(const std::vector<Bytes>& identities) {
  std::vector<Bytes> node_ids;
  std::vector<std::vector<int>> node_members;
  for (int r = 0; r < size(); ++r) {
    const Bytes& id = identities[static_cast<size_t>(r)];
    auto it = std::find(node_ids.begin(), node_ids.end(), id);
    if (it == node_ids.end()) {
      node_ids.push_back(id);
      node_members.emplace_back();
      it = node_ids.end() - 1;
    }
    node_members[static_cast<size_t>(it - node_ids.begin())].push_back(r);
  }
  const size_t per_node = node_members.front().size();
  const bool uniform = std::all_of(node_members.begin(), node_members.end(),
                                   [&](const auto& m) { return m.size() == per_node; });
  if (node_members.size() < 2 || per_node < 2 || !uniform) return;
  int my_node = 0, my_index = 0;
  for (size_t k = 0; k < node_members.size(); ++k) {
    auto it = std::find(node_members[k].begin(), node_members[k].end(), rank());
    if (it != node_members[k].end()) {
      my_node = static_cast<int>(k);
      my_index = static_cast<int>(it - node_members[k].begin());
    }
  }
  const std::string node_name = options_.name + "/node" + std::to_string(my_node);
  auto local = ShmAllreduce::connect(
      *options_.store, options_.key_prefix + "node" + std::to_string(my_node) + "/shm/", my_index,
      static_cast<int>(per_node), options_.timeout, node_name);
  const std::string agreed = options_.key_prefix + "two_level/";
  options_.store->set(agreed + std::to_string(rank()), to_bytes(local ? "1" : "0"));
  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r) keys.push_back(agreed + std::to_string(r));
  options_.store->wait(keys, options_.timeout);
  const auto votes = options_.store->multi_get(keys, options_.timeout);
  if (!std::all_of(votes.begin(), votes.end(),
                   [](const Bytes& v) { return to_string(v) == "1"; })) {
    return;
  }
  Options cross;
  cross.store = options_.store;
  cross.key_prefix = options_.key_prefix + "cross" + std::to_string(my_index) + "/";
  cross.name = options_.name + "/cross" + std::to_string(my_index);
  cross.rank = my_node;
  for (const auto& members : node_members) {
    cross.ranks.push_back(
        options_.ranks[static_cast<size_t>(members[static_cast<size_t>(my_index)])]);
  }
  cross.timeout = options_.timeout;
  cross.device = options_.device;
  cross.resources = options_.resources;
  cross.allreduce_algorithm = options_.allreduce_algorithm;
  cross.shared_memory = false;  // one member per node
  two_level_ = std::make_unique<TwoLevel>(TwoLevel{std::move(local),
                                                   std::make_shared<ProcessGroup>(std::move(cross)),
                                                   my_index, static_cast<int>(per_node)});
}

std::shared_ptr<Work> ProcessGroup::enqueue(std::string what,
                                            std::function<void(uint32_t tag)> run) {
  std::shared_ptr<Work> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) {
      work = std::make_shared<Work>(what + " of group '" + options_.name + "'");
      work->finish(std::make_exception_ptr(CommError(detail::str_cat(
          what, " of group '", options_.name, "' was not run: the group was shut down"))));
      return work;
    }
    const uint64_t seq = next_seq_++;
    what += " #" + std::to_string(seq);
    std::weak_ptr<ProcessGroup> self = weak_from_this();
    work = std::make_shared<Work>(what + " of group '" + options_.name + "'",
                                  [self](const Work& w, Duration timeout) {
                                    if (auto group = self.lock()) group->help(w, timeout);
                                  });
    queue_.push_back(Task{work, std::move(what), seq, std::move(run)});
  }
  wake_.notify_one();
  return work;
}

void ProcessGroup::worker_loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and every queued task ran
    }
    run_next();  // may find the queue empty: a waiting caller ran the task itself
  }
}

bool ProcessGroup::run_next() {
  std::lock_guard<std::mutex> exec(exec_mu_);
  Task task;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.empty()) return false;
    task = std::move(queue_.front());
    queue_.pop_front();
  }
  run_task(task);
  return true;
}

void ProcessGroup::help(const Work& work, Duration timeout) {
  // A collective may take up to the group timeout; a shorter wait must not run it inline.
  if (timeout < options_.timeout) return;
  while (!work.is_completed()) {
    std::unique_lock<std::mutex> exec(exec_mu_, std::try_to_lock);
    if (!exec.owns_lock()) return;  // the worker is running a task; let it
    Task task;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    run_task(task);
  }
}

void ProcessGroup::run_task(Task& task) {
  if (broken_) {
    task.work->finish(std::make_exception_ptr(CommError(
        detail::str_cat(task.what, " of group '", options_.name,
                        "' was not run: the group is broken since ", broken_what_, " failed"))));
    return;
  }
  try {
    task.run(static_cast<uint32_t>(task.seq));
    task.work->finish(nullptr);
    return;
  } catch (const InvalidArgument&) {
    task.work->finish(std::current_exception());  // nothing was sent: the group is intact
    return;
  } catch (const std::exception& e) {
    const bool timed_out = looks_like_timeout(e.what());
    const std::string who = diagnose_failure(task.seq, timed_out);
    const std::string message = detail::str_cat(
        task.what, " of group '", options_.name, "' (rank ", rank(), " of ", size(), ") ",
        timed_out ? "timed out after " + std::to_string(options_.timeout.count()) + " ms"
                  : std::string("failed"),
        ": ", who, ". Cause: ", e.what());
    logger()->error("{}", message);
    broken_ = timed_out ? std::make_exception_ptr(Timeout(message))
                        : std::make_exception_ptr(CommError(message));
    broken_what_ = task.what;
    task.work->finish(broken_);
  }
}

// Costs nothing on the fast path: only a rank whose collective failed writes
// "<prefix>failed/<seq>/<rank>" and waits a grace period for the other members to do the same.
// Ranks that reached the same collective fail too (their peers never answer) and write their
// key; the ones whose key never appears did not arrive. After a timeout the others time out
// about as late, so the grace is half the timeout, at most 30 s; after a lost connection or a
// peer that exited, the others fail within moments, and a dead peer never reports, so 2 s.
std::string ProcessGroup::diagnose_failure(uint64_t seq, bool timed_out) {
  const Duration grace =
      std::min<Duration>(options_.timeout / 2, timed_out ? Duration(std::chrono::seconds(30))
                                                         : Duration(std::chrono::seconds(2)));
  const std::string base = options_.key_prefix + "failed/" + std::to_string(seq) + "/";
  try {
    options_.store->set(base + std::to_string(rank()), to_bytes("1"));
    std::vector<std::string> keys;
    for (int r = 0; r < size(); ++r) keys.push_back(base + std::to_string(r));
    try {
      options_.store->wait(keys, grace);
      return "every rank reached this collective and failed (mismatched collectives, or a "
             "network failure)";
    } catch (const Timeout&) {
    }
    std::vector<int> missing, missing_global;
    for (int r = 0; r < size(); ++r) {
      if (!options_.store->check({keys[static_cast<size_t>(r)]})) {
        missing.push_back(r);
        missing_global.push_back(options_.ranks[static_cast<size_t>(r)]);
      }
    }
    return detail::str_cat("ranks ", detail::format_ranks(missing), " (global ",
                           detail::format_ranks(missing_global),
                           ") did not arrive (no failure report "
                           "from them within ",
                           grace.count(), " ms)");
  } catch (const std::exception& e) {
    return std::string("could not ask the store which ranks arrived: ") + e.what();
  }
}

void ProcessGroup::shutdown(Duration timeout) {
  auto last = enqueue("shutdown drain", [](uint32_t) {});
  {
    std::lock_guard<std::mutex> lock(mu_);
    shut_down_ = true;
  }
  try {
    last->wait(timeout);
  } catch (const Timeout&) {
    throw;
  } catch (const Error&) {
    // A broken group: its earlier failure was reported to whoever waited on it. Still meet the
    // peers, so the live ones do not exit under each other.
  }
  const std::string base = options_.key_prefix + "shutdown/";
  options_.store->set(base + std::to_string(rank()), to_bytes("1"));
  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r) keys.push_back(base + std::to_string(r));
  try {
    options_.store->wait(keys, timeout);
  } catch (const Timeout&) {
    std::vector<int> missing;
    for (int r = 0; r < size(); ++r) {
      if (!options_.store->check({keys[static_cast<size_t>(r)]})) missing.push_back(r);
    }
    HSGD_THROW(Timeout, "ProcessGroup::shutdown of group '", options_.name, "' (rank ", rank(),
               " of ", size(), "): ranks ", detail::format_ranks(missing),
               " did not arrive within ", timeout.count(), " ms");
  }
}

// ---- collectives ----

template <typename T>
std::shared_ptr<Work> ProcessGroup::allreduce_impl(std::span<T> data, ReduceOp op,
                                                   const char* type) {
  std::string what =
      detail::str_cat("allreduce (", data.size(), " x ", type, ", ", to_string(op), ")");
  return enqueue(std::move(what), [this, data, op](uint32_t tag) {
    if (size() == 1 || data.empty()) return;
    AllreduceAlgorithm algorithm = options_.allreduce_algorithm;
    if (algorithm == AllreduceAlgorithm::kAuto && shm_ != nullptr) {
      shm_->allreduce(data, op, std::chrono::steady_clock::now() + options_.timeout);
      return;
    }
    if (algorithm == AllreduceAlgorithm::kAuto && two_level_ != nullptr) {
      two_level_allreduce(data, op);
      return;
    }
    if (algorithm == AllreduceAlgorithm::kAuto) {
      algorithm = data.size_bytes() <= kSmallAllreduceBytes ? AllreduceAlgorithm::kHalvingDoubling
                                                            : AllreduceAlgorithm::kRing;
    }
    if (data.size_bytes() > kAllreduceCacheBytes ||
        data.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
      algorithm = AllreduceAlgorithm::kRing;
    }
    if (algorithm != AllreduceAlgorithm::kRing) {
      auto& entry = algorithm_cache_->get<T>(context_, data.size(), op, algorithm);
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
      opts.setTimeout(options_.timeout);
      gloo::allreduce(opts);
    }
    if (op == ReduceOp::kAvg) {
      const T n = static_cast<T>(size());
      for (auto& x : data) x /= n;
    }
  });
}

// 1. every node reduces the whole buffer in shared memory; 2. member i of each node allreduces
// shard i (of L) with member i of the other nodes over TCP, so the L cross groups share the
// inter-node traffic and each crossing carries the buffer once instead of 2 (p-1)/p times;
// 3. each member keeps its shard, fills the rest with the op's identity, and the node reduces
// once more, which assembles the result (x + 0, min(x, +inf) and max(x, -inf) are exact, so every
// rank gets the same bits).
template <typename T>
void ProcessGroup::two_level_allreduce(std::span<T> data, ReduceOp op) {
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  const ReduceOp inner = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  TwoLevel& plan = *two_level_;
  plan.local->allreduce(data, inner, deadline);
  const size_t shards = static_cast<size_t>(plan.per_node);
  const size_t per = (data.size() + shards - 1) / shards;
  const size_t begin = std::min(data.size(), per * static_cast<size_t>(plan.index));
  const size_t end = std::min(data.size(), begin + per);
  plan.cross->allreduce(data.subspan(begin, end - begin), inner)->wait(options_.timeout);
  const T identity = inner == ReduceOp::kMin   ? std::numeric_limits<T>::infinity()
                     : inner == ReduceOp::kMax ? -std::numeric_limits<T>::infinity()
                                               : T(0);
  std::fill(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(begin), identity);
  std::fill(data.begin() + static_cast<std::ptrdiff_t>(end), data.end(), identity);
  plan.local->allreduce(data, inner, deadline);
  if (op == ReduceOp::kAvg) {
    const T n = static_cast<T>(size());
    for (auto& x : data) x /= n;
  }
}

std::shared_ptr<Work> ProcessGroup::allreduce(std::span<float> data, ReduceOp op) {
  return allreduce_impl(data, op, "float");
}

std::shared_ptr<Work> ProcessGroup::allreduce(std::span<double> data, ReduceOp op) {
  return allreduce_impl(data, op, "double");
}

template <typename T>
std::shared_ptr<Work> ProcessGroup::broadcast_impl(std::span<T> data, int root, const char* type) {
  HSGD_CHECK(root >= 0 && root < size(), "ProcessGroup '", name(), "': broadcast root ", root,
             " must be a rank of the group, in [0, ", size(), ")");
  std::string what = detail::str_cat("broadcast (", data.size(), " x ", type, ", root ", root, ")");
  return enqueue(std::move(what), [this, data, root](uint32_t tag) {
    if (size() == 1 || data.empty()) return;
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(data.data(), data.size());
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    gloo::broadcast(opts);
  });
}

std::shared_ptr<Work> ProcessGroup::broadcast(std::span<float> data, int root) {
  return broadcast_impl(data, root, "float");
}
std::shared_ptr<Work> ProcessGroup::broadcast(std::span<double> data, int root) {
  return broadcast_impl(data, root, "double");
}
std::shared_ptr<Work> ProcessGroup::broadcast(std::span<int64_t> data, int root) {
  return broadcast_impl(data, root, "int64");
}

template <typename T>
std::shared_ptr<Work> ProcessGroup::allgather_impl(std::span<const T> in, std::span<T> out,
                                                   const char* type) {
  HSGD_CHECK(out.size() == in.size() * static_cast<size_t>(size()), "ProcessGroup '", name(),
             "': allgather output has ", out.size(),
             " elements; expected size() * input = ", size(), " * ", in.size());
  std::string what = detail::str_cat("allgather (", in.size(), " x ", type, ")");
  return enqueue(std::move(what), [this, in, out](uint32_t tag) {
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

std::shared_ptr<Work> ProcessGroup::allgather(std::span<const float> in, std::span<float> out) {
  return allgather_impl(in, out, "float");
}
std::shared_ptr<Work> ProcessGroup::allgather(std::span<const int64_t> in, std::span<int64_t> out) {
  return allgather_impl(in, out, "int64");
}

std::shared_ptr<Work> ProcessGroup::barrier() {
  return enqueue("barrier", [this](uint32_t tag) {
    if (size() == 1) return;
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    gloo::barrier(opts);
  });
}

}  // namespace hsgd::comm
