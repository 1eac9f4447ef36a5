#pragma once
// ProcessGroup: a set of ranks that run collectives together over Gloo's TCP transport (like
// torch's ProcessGroupGloo), with allreduce over shared memory when every member runs on one
// node (comm/process_group/shm_allreduce.h). Works on raw buffers; knows nothing of Tensor.
//
// CONTRACT: collectives are called in the same order on every rank of a group, with the same
// sizes, types, ops and roots (allgather_bytes alone takes a different length on each rank).
// Breaking it leads to an error, never to a silent hang or a crash: every collective has the
// group's deadline (InitOptions::timeout, HSGD_TIMEOUT_MS, default 300 s), and mismatched
// collectives use different Gloo tags (their fingerprints differ, see
// comm/process_group/detail/collective_fingerprint.h), so they time out rather than exchange
// messages of the wrong size. A failed collective is hsgd::Timeout (or hsgd::CommError) saying what
// each rank of the group was doing, e.g. "rank 0 is in allreduce (272474 x float, sum) #24
// 'averager 2:4'; ranks 1-3 are in broadcast (98 x float, root 0) #23 'DDP buffers'", and which
// ranks did not report at all (not in a collective of this group, or dead). The optional label of
// each collective is only for these messages; it may differ between ranks.
//
// Each group owns one worker thread: collectives are queued (FIFO) and run there, so the caller
// can compute while they run; each returns a Work to wait on. Buffers must stay alive and
// untouched until that Work completed. A caller that waits at once passes RunOn::kCaller: the
// collective then runs on the calling thread when the group is idle, without the two thread
// hand-offs (to the worker and back), and the call blocks until it completed. After a failed
// collective the group is broken (Gloo's connections may hold half a message): later collectives
// fail at once with hsgd::CommError quoting the first failure. Create a new group (or restart the
// job) to recover.
//
// Ranks in different collectives are found within seconds rather than at the timeout: a
// collective that has waited longer than Options::mismatch_check (HSGD_MISMATCH_CHECK_MS,
// default 2 s) publishes its fingerprint through the store and compares it with the other
// members' (comm/process_group/detail/collective_watchdog.h). A mismatch (another member waits
// in another collective, or left the group before reaching this one) fails the collective on
// every rank that waits with CollectiveMismatch, e.g. "the ranks of group 'world' are in
// different collectives: barrier #7 'Checkpointer::save(step 10)' was called on rank 0 only;
// ranks 1-3 are in allreduce (272 x float, sum) #7 'DDP bucket 0'. ...". Collectives that
// complete within the threshold cost nothing more. A member that is in no collective (still
// computing) is not a mismatch: that case still ends at the group's timeout.
//
// Groups are made by init_process_group() (the world) and new_group() / new_subgroups() /
// new_subgroups_by_enumeration() (declared at the end of this header). Each group has its own
// key prefix in the store and its own Gloo context; all groups of one process tree share one
// Gloo device (one network thread).
//
// Usage:
//   auto world = hsgd::comm::init_process_group(hsgd::comm::InitOptions::from_env());
//   std::vector<float> grad(1000, 1.0f);
//   auto work = world->allreduce(grad, hsgd::comm::ReduceOp::kAvg);   // runs on the worker
//   // ... compute ...
//   work->wait();
//   world->allreduce(grad, hsgd::comm::ReduceOp::kSum, "sum", hsgd::comm::RunOn::kCaller)
//       ->wait(world->work_timeout());                            // runs on this thread
//   auto [node, all_nodes] = hsgd::comm::new_subgroups(world, 4);

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/error.h"
#include "comm/process_group/work.h"
#include "comm/store/store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace hsgd::comm {
class ProcessGroup;
}  // namespace hsgd::comm

// Comm-internal parts of ProcessGroup, each in comm/detail/<name>.h.
namespace hsgd::detail {
class CollectiveQueue;     // the FIFO of collectives and the worker thread
class CollectiveWatchdog;  // finds ranks in different collectives within seconds
struct MismatchReport;
struct CollectiveFingerprint;  // what a collective is, for tags and failure reports
class GlooAllreduce;           // Gloo algorithm choice and cache
class TwoLevelAllreduce;       // shared memory within nodes, TCP between them
std::shared_ptr<comm::ProcessGroup> make_child_group(
    const std::shared_ptr<comm::ProcessGroup>& parent, std::vector<int> parent_ranks);
}  // namespace hsgd::detail

namespace hsgd::comm {

class ShmAllreduce;
enum class ReduceOp { kSum, kAvg, kMin, kMax };
const char* to_string(ReduceOp op);

// Which thread runs a collective; either way collectives of a group run one at a time, in the
// order they were called, with the same deadline, mismatch check and failure rules.
// - kWorker: the group's worker thread. The call returns at once, so the caller can compute
//   while the collective runs (DDP overlaps its buckets with backward this way).
// - kCaller: for a caller that waits at once. When no collective of the group is queued or
//   running, the calling thread runs it and the call returns its completed Work (a failure is
//   in the Work, thrown by wait()); the call then blocks up to the group's deadline plus the
//   failure report's wait, like wait(work_timeout()). When the group is busy it is queued as
//   with kWorker. Saves the hand-off to the worker and back (tens of microseconds, more when
//   ranks share cores). Do not use it where a peer may need this rank to go on before it joins
//   the collective (e.g. collectives of two groups issued in different orders on two ranks).
enum class RunOn { kWorker, kCaller };

// The error of a collective when the members of its group were found in different collectives
// (see the header comment). what() names what each rank is in, the root cause first.
class CollectiveMismatch : public CommError {
 public:
  CollectiveMismatch(const std::string& message, std::vector<int> same_ranks)
      : CommError(message), same_ranks_(std::move(same_ranks)) {}
  // The members (group ranks) that were in the same collective as this rank, this one included.
  const std::vector<int>& same_ranks() const { return same_ranks_; }

 private:
  std::vector<int> same_ranks_;
};

// Which algorithm allreduce uses (like NCCL_ALGO). kAuto uses shared memory when every member
// of the group runs on this node (Options::shared_memory), else picks a Gloo algorithm by size;
// the others force that Gloo algorithm, for benchmarks and for working around a slow path on
// unusual networks.
enum class AllreduceAlgorithm {
  kAuto,
  kHalvingDoubling,  // gloo::AllreduceHalvingDoubling: 2 log2(p) steps, for small buffers
  kRingChunked,      // gloo::AllreduceRingChunked: pipelined ring, bandwidth-optimal
  kRing,             // gloo::allreduce ring on the caller's memory (no copy, no cached state)
  kPinnedRing,       // gloo::AllreduceRing: the whole buffer around the ring, p - 1 steps, for
                     // small buffers on 2 ranks; on more, each rank sums in its own order, so
                     // float sums may differ in the last bits between ranks
  kDirect,           // every rank sends its buffer to every other in one round and sums them in
                     // rank order: one step, (p - 1) x the buffer per rank, for small buffers
  kDirectScatter,    // reduce-scatter and allgather, each one step to every peer, sums in rank
                     // order: 2 steps, 2 (p - 1) / p x the buffer per rank
};
const char* to_string(AllreduceAlgorithm algorithm);
// Every algorithm's to_string name ("auto", "halving-doubling", ...), in declaration order.
std::vector<std::string> allreduce_algorithm_names();
// The algorithm whose to_string name is `name`; nullopt for any other text.
std::optional<AllreduceAlgorithm> parse_allreduce_algorithm(std::string_view name);
// The same, but other text throws InvalidArgument "<what>='<name>' must be one of auto, ...";
// `what` names where the text came from (an environment variable, a flag).
AllreduceAlgorithm allreduce_algorithm_named(std::string_view name, std::string_view what);

// kAuto over Gloo (shared memory off, or members on several nodes) picks by the buffer's bytes
// and the group's size, the same on every rank:
// - while each rank sends (p - 1) x bytes <= kDirectAllreduceBytes: kDirect, one step where
//   halving-doubling needs 2 log2(p) and Gloo's ring p - 1 (each with a notification back). On 2
//   ranks it sends what any allreduce sends; on more it sends (p - 1) x the buffer where
//   halving-doubling sends 2 (p - 1) / p x, so the bound keeps it to buffers whose bytes cost
//   less than the steps it saves (on a 100 Mbit/s link the worst case, 4 ranks at 170 KiB, sends
//   255 KiB more: about 20 ms).
// - up to kSmallAllreduceBytes: kDirectScatter, 2 steps where halving-doubling needs 2 log2(p),
//   the same bytes, no per-message handshake, and nothing copied in (its messages leave from the
//   caller's buffer; halving-doubling works on a copy).
// - above: kRing on the caller's memory. It skips the copy in and out of the pinned algorithms
//   and pipelines its segments, which from here on outweighs its receive-ready round trip per
//   segment (milliseconds on small buffers).
// The measurements behind the numbers: docs/benchmarks.md, "Allreduce".
inline constexpr size_t kDirectAllreduceBytes = 512u << 10;
inline constexpr size_t kSmallAllreduceBytes = 1u << 20;
// The pinned algorithm objects (halving-doubling, ring-chunked, pinned ring, direct) are built once
// per (type, count, op) and cached, least recently used first out, up to this many buffer bytes;
// halving-doubling and ring-chunked run on a group-owned buffer (the caller's data is copied in
// and out), the pinned ring on the caller's. A buffer larger than the whole cache runs kRing on
// the caller's memory instead.
inline constexpr size_t kAllreduceCacheBytes = 256u << 20;

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  // How a group is built; filled in by init_process_group() and new_group().
  struct Options {
    std::shared_ptr<Store> store = nullptr;  // shared by every group of the job
    std::string key_prefix = "";             // unique to this group, e.g. "run/0/pg/g3/"
    std::string name = "";                   // for messages and logs, e.g. "world/g3"
    int rank = 0;                            // rank of this process within the group
    std::vector<int> ranks = {};             // global ranks of the members, indexed by group rank
    Duration timeout = kDefaultTimeout;
    std::shared_ptr<gloo::transport::Device> device = nullptr;
    // Kept alive as long as the group (e.g. the embedded rendezvous server of rank 0);
    // subgroups share their parent's.
    std::shared_ptr<void> resources = nullptr;
    AllreduceAlgorithm allreduce_algorithm = AllreduceAlgorithm::kAuto;  // subgroups inherit it
    // kAuto allreduces of a group whose members all run on one node go through shared memory
    // (comm/process_group/shm_allreduce.h) instead of Gloo; subgroups inherit it.
    bool shared_memory = true;
    // Ranks per node of the job as its launcher declared them (InitOptions::local_world_size,
    // LOCAL_WORLD_SIZE); 0 = not declared. Describes the job's nodes, not this group's members,
    // so subgroups inherit it. Under hsgd-run it may differ between nodes (--nproc-per-node).
    int local_world_size = 0;
    // The node this process runs on as its launcher declared it (InitOptions::node_rank,
    // GROUP_RANK); -1 = not declared. A property of the process, so subgroups inherit it.
    int node_rank = -1;
    // A collective that has waited this long publishes its fingerprint and checks that the other
    // members are not in another collective (see the header comment); 0 turns the check off.
    // Subgroups inherit it.
    Duration mismatch_check = std::chrono::seconds(2);
    // A failed collective asks the other members through the store what they were doing and
    // names them in its error (who is in which collective, who did not report), waiting for
    // their reports up to a grace: after a lost connection (live peers fail within moments, a
    // dead one never reports) diagnosis_grace_after_loss; after a timeout (the others time out
    // about as late) diagnosis_grace_after_timeout, at most half the timeout. A grace of 0 skips
    // the question: the error names the cause only. Subgroups inherit them.
    Duration diagnosis_grace_after_loss = std::chrono::seconds(2);
    Duration diagnosis_grace_after_timeout = std::chrono::seconds(30);
  };

  // Connects to every other member (blocks until all arrived). Throws hsgd::Timeout naming the
  // ranks that did not arrive within options.timeout; hsgd::InvalidArgument on bad options.
  // Prefer init_process_group() / new_group().
  explicit ProcessGroup(Options options);
  // Runs the collectives still queued (each bounded by the group timeout), then stops.
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return options_.rank; }
  int size() const { return static_cast<int>(options_.ranks.size()); }
  const std::string& name() const { return options_.name; }
  const std::vector<int>& ranks() const { return options_.ranks; }  // global ranks of members
  Duration timeout() const { return options_.timeout; }
  // What to pass to Work::wait to get a failed collective's own error, with its report of what
  // every rank is doing, rather than a bare Work::wait timeout: the collective's deadline plus
  // the time the failure diagnosis may take (see process_group.cpp), plus a margin.
  Duration work_timeout() const;
  std::shared_ptr<Store> store() const { return options_.store; }
  const std::string& key_prefix() const { return options_.key_prefix; }

  // ---- collectives: each queues the operation and returns at once (unless RunOn::kCaller) ----

  // label (optional, e.g. "DDP buffers", "averager 2:4") names the collective in failure
  // reports: what the caller was doing, since the other arguments rarely say. run_on: which
  // thread runs it (see RunOn).

  // Element-wise reduction across the group, in place. kAvg divides the sum by size().
  std::shared_ptr<Work> allreduce(std::span<float> data, ReduceOp op = ReduceOp::kSum,
                                  std::string_view label = {}, RunOn run_on = RunOn::kWorker);
  std::shared_ptr<Work> allreduce(std::span<double> data, ReduceOp op = ReduceOp::kSum,
                                  std::string_view label = {}, RunOn run_on = RunOn::kWorker);

  // Copies root's data into data on every rank. root is a rank within this group.
  std::shared_ptr<Work> broadcast(std::span<float> data, int root, std::string_view label = {},
                                  RunOn run_on = RunOn::kWorker);
  std::shared_ptr<Work> broadcast(std::span<double> data, int root, std::string_view label = {},
                                  RunOn run_on = RunOn::kWorker);
  std::shared_ptr<Work> broadcast(std::span<int64_t> data, int root, std::string_view label = {},
                                  RunOn run_on = RunOn::kWorker);

  // out[r * in.size() .. (r+1) * in.size()) receives rank r's in; out.size() == size()*in.size().
  std::shared_ptr<Work> allgather(std::span<const float> in, std::span<float> out,
                                  std::string_view label = {}, RunOn run_on = RunOn::kWorker);
  std::shared_ptr<Work> allgather(std::span<const int64_t> in, std::span<int64_t> out,
                                  std::string_view label = {}, RunOn run_on = RunOn::kWorker);
  // Variable lengths: out (resized to size()) receives every rank's in, out[r] rank r's; each
  // rank may pass another length, "" included. Two Gloo allgathers (the lengths, then the bytes
  // padded to the longest), one queued collective. For small values exchanged once (the
  // descriptions of an agreement check, comm/process_group/agreement.h), not for bulk data.
  std::shared_ptr<Work> allgather_bytes(std::string_view in, std::vector<std::string>& out,
                                        std::string_view label = {}, RunOn run_on = RunOn::kWorker);

  // Ring exchange: rank r sends `send` to rank (r + 1) % size() and receives into `recv` what
  // rank (r - 1 + size()) % size() sent; send.size() == recv.size(), the same on every rank. A
  // step of a ring algorithm whose reduction the caller does between steps (e.g. 16-bit values
  // on the wire, float32 sums, framework/distributed/model_averaging/compressed_average.h).
  // Point-to-point over Gloo's TCP pairs (never shared memory). One rank: recv = send.
  std::shared_ptr<Work> ring_exchange(std::span<const int64_t> send, std::span<int64_t> recv,
                                      std::string_view label = {}, RunOn run_on = RunOn::kWorker);

  // Completes once every rank of the group has called barrier().
  std::shared_ptr<Work> barrier(std::string_view label = {}, RunOn run_on = RunOn::kWorker);
  // A barrier that meets only a named_barrier of the same name: the name is part of the
  // fingerprint, so a rank that reaches this point in another named_barrier (or any other
  // collective) is reported as a mismatch after Options::mismatch_check, naming both. For
  // collective calls that must happen at the same place on every rank
  // ("Checkpointer::save(step 10)", "AveragedReplicas at train.cpp:42").
  std::shared_ptr<Work> named_barrier(std::string_view name, RunOn run_on = RunOn::kWorker);

  // Call before the process exits (like torch's destroy_process_group). Waits for the queued
  // collectives, then meets the other members through the store (not through Gloo). A rank that
  // exits right after its last collective can close a connection on which a slower peer still
  // sends the tail of that collective, making the peer fail; after shutdown() no member has a
  // Gloo message in flight. Blocking and collective; throws hsgd::Timeout naming the members
  // that did not arrive, hsgd::CommError when abort() was called meanwhile (seen between
  // waits of Options::mismatch_check). Collectives queued afterwards fail with hsgd::CommError.
  void shutdown(Duration timeout = kDefaultTimeout);

  // Makes every collective of this group and of the groups made from it (new_group,
  // new_subgroups, and theirs) fail at once, on this rank and on the peers waiting in it: shuts
  // their connections down. The groups are unusable afterwards, as after any failure, and their
  // destructors return without waiting for a timeout, so no thread is left inside their Gloo
  // contexts. For abandoning a world that lost a member (comm/elastic/elastic_world.h).
  // Collectives that fail from an abort, here or on a peer, throw hsgd::CommError naming the
  // rank that aborted, without the failure diagnosis's wait for the other members: abort()
  // records itself under the group's key prefix in the store before shutting the connections
  // down (with the store unreachable, that write may take the store's timeout).
  // Thread-safe; calling it again does nothing more.
  void abort();
  // Whether a collective of this group failed or abort() was called on it (or on its parent):
  // the group refuses work. Thread-safe.
  bool failed() const;

  // ---- configuration ----
  // The job's ranks per node as the launcher declared them (Options::local_world_size; the same
  // in every group of the job), or 0 when not declared. The node layout the intra-node group of
  // post-local SGD is built from.
  int local_world_size() const { return options_.local_world_size; }
  // This process's node as the launcher declared it (Options::node_rank), or -1. Which ranks
  // share a node is a collective question: see gather_node_layout
  // (comm/process_group/node_layout.h).
  int node_rank() const { return options_.node_rank; }
  AllreduceAlgorithm allreduce_algorithm() const { return options_.allreduce_algorithm; }
  // Whether kAuto allreduces of this group run over shared memory (every member on one node).
  bool uses_shared_memory() const { return shm_ != nullptr; }
  // Whether kAuto allreduces run in two levels: shared memory within each node, TCP between
  // nodes (members on at least two nodes, the same number >= 2 on each).
  bool uses_two_level_allreduce() const { return two_level_ != nullptr; }

 private:
  // shutdown()'s last phase: each member says it is done with the store; the member holding
  // options_.resources (the host of an embedded rendezvous server) waits for all of them, until
  // deadline (a warning, not an error, after it).
  void wait_until_peers_left_store(const std::string& what,
                                   std::chrono::steady_clock::time_point deadline);
  // Takes the child id and reads options_ (device, resources...) of the parent.
  friend std::shared_ptr<ProcessGroup> hsgd::detail::make_child_group(
      const std::shared_ptr<ProcessGroup>& parent, std::vector<int> parent_ranks);

  std::shared_ptr<Work> enqueue(hsgd::detail::CollectiveFingerprint fp, RunOn run_on,
                                std::function<void(uint32_t tag)> run);
  // A barrier of all members with fingerprint fp (barrier and named_barrier differ only in it).
  std::shared_ptr<Work> enqueue_barrier(hsgd::detail::CollectiveFingerprint fp, RunOn run_on);
  // The error that breaks the group after the collective fp failed with e.
  std::exception_ptr on_failure(const hsgd::detail::CollectiveFingerprint& fp,
                                const std::exception& e);
  // The watchdog found members in different collectives: fail the collective running now.
  void abort_on_mismatch(const hsgd::detail::MismatchReport& report);
  // Makes every wait of this group's transports (Gloo, shared memory, two levels) fail at once;
  // the group is unusable afterwards.
  void abort_transport();
  friend class hsgd::detail::TwoLevelAllreduce;  // aborts its cross-node group
  // After a failure: what each member was doing (see process_group.cpp).
  std::string diagnose_failure(const hsgd::detail::CollectiveFingerprint& fp, Duration grace);
  // The rank that aborted this group (abort(), here or on a peer), or -1.
  int aborted_by();
  template <typename T>
  std::shared_ptr<Work> allreduce_impl(std::span<T> data, ReduceOp op, const char* type,
                                       std::string_view label, RunOn run_on);
  template <typename T>
  std::shared_ptr<Work> broadcast_impl(std::span<T> data, int root, const char* type,
                                       std::string_view label, RunOn run_on);
  template <typename T>
  std::shared_ptr<Work> allgather_impl(std::span<const T> in, std::span<T> out, const char* type,
                                       std::string_view label, RunOn run_on);
  void connect();

  // Constant after construction.
  const Options options_;
  std::shared_ptr<gloo::Context> context_;                       // set when size() > 1
  std::unique_ptr<hsgd::detail::GlooAllreduce> gloo_allreduce_;  // with context_
  std::unique_ptr<ShmAllreduce> shm_;  // set when every member runs on this node
  // Set when the members span nodes with the same number >= 2 on each.
  std::unique_ptr<hsgd::detail::TwoLevelAllreduce> two_level_;

  // The id of the next child group (hsgd::detail::make_child_group): every member creates children
  // in the same order, so the same child gets the same id (and key prefix) on every rank.
  std::atomic<int64_t> next_child_id_{0};
  // The groups made from this one, for abort().
  std::mutex children_mu_;
  std::vector<std::weak_ptr<ProcessGroup>> children_;
  std::atomic<bool> aborted_{false};

  // Set when size() > 1 and options_.mismatch_check > 0; outlives queue_.
  std::unique_ptr<hsgd::detail::CollectiveWatchdog> watchdog_;
  // Runs the collectives; gloo_allreduce_ is used only by the task it runs. Created last in the
  // constructor (it starts the worker thread), destroyed first.
  std::unique_ptr<hsgd::detail::CollectiveQueue> queue_;
};

}  // namespace hsgd::comm

#include "comm/process_group/init.h"         // IWYU pragma: export
#include "comm/process_group/node_layout.h"  // IWYU pragma: export
#include "comm/process_group/subgroups.h"    // IWYU pragma: export
