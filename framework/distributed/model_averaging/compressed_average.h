#pragma once
// CompressedAverage: the group mean of a float32 payload with compressed values (16-bit, int8,
// int4: compression.h) on the wire between nodes and float32 sums everywhere else (the
// averaging of a compressed level, level_options.h).
// Internal to the averagers (averaging_level.h).
//
// Node layout: comm/process_group/node_layout.h (the nodes the launcher declared, uneven ones
// included; one node when nothing was declared, and then nothing is rounded). The members of the
// group on one node form its node; the lowest group rank of a node is its leader. Leaders are
// numbered 0..N-1 in group rank order.
//
// Rule (n values, g members, N nodes). Steps 1 and 3 run on the caller's thread (start() and
// wait()): they stay within a node (shared memory, about a millisecond for a few MB), and the
// node's members reach them together. Step 2, the part that crosses the slow links, runs on a
// helper thread on each leader, so that the caller can go on; nothing else runs there, so the
// transfer starts at once and no node member's thread has to be scheduled for it to finish:
//   1. node sum: s = the float32 sum of the node's payloads (the node group's allreduce: in
//      rank order over shared memory);
//   2. N == 1: T = s (nothing crosses a node, nothing is rounded). N >= 2: the leaders run a
//      ring reduce-scatter then a ring allgather over chunks k = [k c, (k+1) c) of the buffer,
//      c = ceil(n / N). Chunk k visits leaders k, k+1, ..., k+N-1 (mod N); the leader at
//      position j of that walk computes, per value,
//          a = s                 (j == 0)
//          a = decoded_in + s    (j > 0, decoded_in: what the previous leader sent, decoded)
//          v = a + e             (e: the leader's error-feedback residual; without it v = a)
//          q = encode(v);        e := v - decode(q) (with error feedback)
//      (encode/decode: compression.h; a block format quantizes the chunk's values in blocks
//      counted from the chunk's first value) and sends q to the next leader (j < N-1), or, being
//      the last (the owner of chunk k), sends q around the ring unchanged (the allgather).
//      T = decode(q) of the owner's q, the same bits on every leader. Each leader encodes each
//      value exactly once per averaging, so its residual holds exactly its own rounding errors;
//   3. the leader hands T to its node (the node group's allreduce of T and zeros: exact);
//   4. D = T / g on every member.
// Bytes on the wire between nodes: a leader sends 2 (N - 1) chunks of packed_words(compression,
// c) int64 words (compression.h): about 2 (N - 1) n / N times 2 bytes (16-bit), 33/32 (int8) or
// 17/32 (int4); a float32 ring allreduce sends 4. The other members send nothing between nodes.
//
// Usage (every member of pg, in the same order):
//   std::vector<float> payload(1000, 1.0f), residual(1000, 0.0f);  // residual: error feedback
//   detail::CompressedAverage avg(pg, Compression::kBF16, 1.0f);  // collective: makes its groups
//   const int64_t bytes = avg.start(payload, residual);           // payload in, D out
//   avg.wait();                                                   // throws the collectives' errors

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <span>
#include <vector>

#include "comm/process_group/process_group.h"
#include "framework/distributed/model_averaging/level_options.h"

namespace hsgd::distributed::detail {

class CompressedAverage {
 public:
  // Collective over group (size >= 2): gathers the node layout (InvalidArgument on every rank
  // when it cannot be told, see NodeLayout::nodes) and creates the private node and leader
  // groups the helper thread uses (never `group` itself, which the caller may use meanwhile).
  CompressedAverage(const std::shared_ptr<comm::ProcessGroup>& group, Compression compression,
                    float scale);
  // Completes an averaging in flight as wait() does (each collective is bounded by the group
  // timeout), logging instead of throwing its error.
  ~CompressedAverage();
  CompressedAverage(const CompressedAverage&) = delete;
  CompressedAverage& operator=(const CompressedAverage&) = delete;

  // Starts the averaging of buffer (n,): payload in, D out after wait(). residual is empty or
  // (n,) (error feedback; only a leader reads and writes it). Both must stay alive and untouched
  // until wait() returned. Runs step 1 (a collective of the node: every member of the node calls
  // start at the same point of its sequence). Returns the bytes this rank will send between
  // nodes.
  int64_t start(std::span<float> buffer, std::span<float> residual);
  // Completes the averaging started last: waits for the ring, then runs steps 3 and 4 (a
  // collective of the node, like start). Rethrows the collectives' errors. No-op when none is
  // in flight.
  void wait();

  int nodes() const { return nodes_; }
  bool leader() const { return leader_; }
  // When step 2 (the ring between nodes) of the averaging waited for last ended on this
  // leader (valid after wait() on a leader of N >= 2 nodes).
  std::chrono::steady_clock::time_point ring_finished_at() const { return ring_finished_at_; }

 private:
  // Step 2 on a leader: the ring over the leaders; buffer holds s in, T out.
  void ring(std::span<float> buffer, std::span<float> residual);

  // Constant after construction.
  const Compression compression_;
  const float scale_;
  const int group_size_;
  int nodes_ = 1;
  bool leader_ = false;
  std::shared_ptr<comm::ProcessGroup> node_;     // this rank's node (null: alone on it)
  std::shared_ptr<comm::ProcessGroup> leaders_;  // the leaders (null: not a leader, or N == 1)

  bool in_flight_ = false;                                  // started, wait() not called yet
  std::span<float> buffer_;                                 // the buffer of the averaging in flight
  std::future<void> job_;                                   // step 2 on a leader of N >= 2 nodes
  std::chrono::steady_clock::time_point ring_finished_at_;  // written by job_, read after it
  std::vector<float> acc_;            // (c,) a, then v, of the chunk being encoded
  std::vector<int64_t> send_, recv_;  // (packed_words(compression_, c),) the ring's messages
};

}  // namespace hsgd::distributed::detail
