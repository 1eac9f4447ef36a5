#pragma once
// ShmAllreduce: allreduce through one shared-memory segment, for a group whose members all run
// on one node. Gloo's TCP transport pushes every byte through the loopback stack twice (send
// and receive copies, plus a hand-off between the two ranks' network threads), which is what
// makes an intra-node allreduce slow; here each rank copies its data into the segment once,
// reduces its 1/size share of every chunk from all ranks' copies, and copies the result out.
// That intra-node link is the one hierarchical averaging uses most often.
//
// Used by ProcessGroup (kAuto algorithm) when every member reported the same node_identity()
// and the segment could be created and mapped by all of them; otherwise the group stays on
// Gloo. Disabled by InitOptions::shared_memory = false (HSGD_SHM=0).
//
// Protocol per chunk (two halves of the segment alternate, so a chunk's copy-in never waits
// for the previous chunk's readers):
//   1. copy my chunk into my slot               2. barrier (all slots written)
//   3. reduce my share of the chunk into result 4. barrier (result complete)
//   5. copy the result chunk out
// Barriers are a shared counter with futex waits (shared, not private: the word is in a
// mapping of several processes). A waiter wakes every 100 ms to check the deadline and whether
// the ranks it waits for are still alive, so a dead peer is reported in about 100 ms and a
// stuck one at the group timeout; never a hang.
//
// Not thread-safe: a ProcessGroup runs its collectives one at a time.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "comm/store/store.h"

namespace hsgd::comm {

enum class ReduceOp;

// Names this process's node for the purpose of sharing memory: host name, boot id, the mount
// and pid namespaces (shm_open needs the same /dev/shm, liveness checks the same pids), and the
// node rank the launcher declared: node_rank when >= 0 (ProcessGroup::Options::node_rank; an
// elastic world's changes with the generations), else GROUP_RANK when set, so that two hsgd-run
// agents on one machine, which emulate two nodes, keep their traffic on the network.
std::string node_identity(int node_rank);

class ShmAllreduce {
 public:
  // Largest group that uses shared memory: beyond it the per-group gather of node identities
  // costs more than it saves, and no node has that many ranks.
  static constexpr int kMaxRanks = 64;

  // Collective over the members of one group, through the store under key_prefix ("<group
  // prefix>shm/"). Rank 0 creates the segment and publishes its name; the others map it; all
  // agree. Returns nullptr on every rank when any rank could not create or map it (then the
  // group uses Gloo). Throws hsgd::Timeout when a member does not take part within timeout.
  // The segment's name is unlinked as soon as every member mapped it, so nothing is left in
  // /dev/shm even if the job is killed.
  static std::unique_ptr<ShmAllreduce> connect(Store& store, const std::string& key_prefix,
                                               int rank, int size, Duration timeout,
                                               const std::string& group_name);
  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  // In-place allreduce; the same sequence of calls (sizes, ops) on every member. kAvg divides
  // the sum by size(). Every rank gets bitwise identical results. Throws hsgd::Timeout when
  // a member does not arrive before deadline, hsgd::CommError when one exited, and
  // hsgd::InvalidArgument on every rank when the members passed different sizes, types or ops
  // (then no buffer changed and the channel stays usable; Gloo would time out or mix data).
  void allreduce(std::span<float> data, ReduceOp op,
                 std::chrono::steady_clock::time_point deadline);
  void allreduce(std::span<double> data, ReduceOp op,
                 std::chrono::steady_clock::time_point deadline);

  // Makes the allreduce running now (and every later one) fail with hsgd::CommError within the
  // 100 ms wait slice, instead of waiting for its deadline: the group found that its members
  // are in different collectives. Thread-safe; the channel is unusable afterwards.
  void abort() { aborted_.store(true, std::memory_order_relaxed); }
  // The same on every member (a flag in the segment, read within the same wait slice): this
  // rank abandons the group (ProcessGroup::abort) and the others must not wait for it.
  void abort_members();

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Bytes of one rank's slot (one chunk); a buffer is processed in chunks of this size.
  static constexpr size_t kChunkBytes = size_t{512} << 10;

 private:
  struct Header;
  ShmAllreduce(void* base, size_t bytes, int rank, int size, std::string group_name);
  template <typename T>
  void allreduce_impl(std::span<T> data, ReduceOp op,
                      std::chrono::steady_clock::time_point deadline);
  void barrier(std::chrono::steady_clock::time_point deadline);
  // Why the ranks disagree on the collective (the same text on every rank), or "".
  std::string check_same_call(size_t count, size_t element_bytes, ReduceOp op) const;
  // Throws if a rank we wait for has exited or the deadline passed (then naming the ranks
  // behind barrier number `target_round`).
  void check_peers(uint32_t target_round, std::chrono::steady_clock::time_point deadline);
  char* slot(int half, int rank) const;
  char* result(int half) const;

  void* base_;
  size_t bytes_;
  int rank_;
  int size_;
  std::string group_name_;
  Header* header_;
  uint32_t rounds_ = 0;  // barriers this rank passed
  uint64_t chunks_ = 0;  // chunks processed, picks the half of the segment
  std::atomic<bool> aborted_{false};
};

}  // namespace hsgd::comm
