#pragma once
// CollectiveFingerprint: what one collective of a group is (comm-internal): its kind, sequence
// number, element count, element type, the arguments that must match (op, root) and the
// caller's optional label ("averager 2:4", "DDP buffers"). Built on every call from values the
// caller already passed, so it costs a few words and no communication.
//
// Two uses:
// - The Gloo tag of a collective mixes the sequence number with a hash of the parts that must
//   agree (kind, type, count, op/root; not the label). Ranks that call mismatched collectives
//   then post their messages on different Gloo slots, so they time out and are diagnosed instead
//   of reading a message of the wrong size (which aborts the process inside Gloo).
// - After a failure, each rank publishes describe() through the store, and the failure message
//   says what each rank was doing (ProcessGroup::diagnose_failure):
//     rank 0 is in allreduce (272474 x float, sum) #24 'averager 2:4';
//     ranks 1-3 are in broadcast (98 x float, root 0) #23 'DDP buffers'
//
// Usage (inside ProcessGroup; not compiled: uses its private members):
//   CollectiveFingerprint fp{.kind = "broadcast", .dtype = "float", .count = n,
//                            .args = "root 0", .label = std::string(label)};
//   queue_->enqueue(std::move(fp), run, helper);   // the queue sets fp.seq

#include <cstdint>
#include <string>

namespace hsgd::detail {

struct CollectiveFingerprint {
  const char* kind = "";   // "allreduce", "broadcast", "allgather", "barrier"
  const char* dtype = "";  // "float", "double", "int64"; "" for a barrier
  uint64_t count = 0;      // elements per rank (allgather: its input)
  std::string args = "";   // what else must match: "sum", "root 0"; may be ""
  std::string label = "";  // the caller's name for it; may be "" and may differ between ranks
  uint64_t seq = 0;        // position in the group's sequence of collectives (set by the queue)

  // "allreduce (1000 x float, sum) #7 'averager 2:4'" (no parenthesis for a barrier, no label
  // part when there is none).
  std::string describe() const;
  // A hash of kind, dtype, count and args: equal on ranks that called matching collectives.
  uint32_t shape_hash() const;
};

// The Gloo tag of collective seq: the low 20 bits of seq (collectives of a group run one at a
// time, so only neighbours must differ) and 12 bits of shape_hash.
uint32_t gloo_tag(uint64_t seq, uint32_t shape_hash);

}  // namespace hsgd::detail
