#pragma once
// GlooAllreduce: the Gloo side of ProcessGroup::allreduce (comm-internal): which Gloo algorithm
// an allreduce runs (choose_gloo_algorithm), the cache of Gloo's pinned-buffer algorithm
// objects, and the sizing of the context's send buffers that the group's other collectives ask
// for (prepare_unbound). The measurements behind the choice are in docs/benchmarks.md,
// "Allreduce".
//
// CONTRACT: the same sequence of calls (type, count, op, algorithm; bytes for prepare_unbound)
// on every rank of the context, one at a time (the group's collective queue runs them). Errors are
// Gloo's exceptions (timeouts, lost connections), which the queue turns into the group's error.
//
// Usage (inside ProcessGroup, after connecting; not compiled: uses its private members):
//   gloo_allreduce_ = std::make_unique<GlooAllreduce>(context_, options_.timeout);
//   gloo_allreduce_->allreduce(data, op, options_.allreduce_algorithm, tag);
//   gloo_allreduce_->prepare_unbound(data.size_bytes());  // then gloo::broadcast(...)

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "comm/process_group/process_group.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace hsgd::detail {

// The algorithm an allreduce of count elements of element_bytes each over `ranks` ranks runs when
// the group asks for `requested`: kAuto picks kDirect while each rank sends (ranks - 1) x the
// buffer <= kDirectAllreduceBytes, kDirectScatter for the other buffers up to
// kSmallAllreduceBytes and kRing above (the rule and its reasons are at those constants in
// process_group.h); a buffer larger than the cache (kAllreduceCacheBytes) or than Gloo's int
// count always runs kRing. Never returns kAuto.
comm::AllreduceAlgorithm choose_gloo_algorithm(comm::AllreduceAlgorithm requested, size_t count,
                                               size_t element_bytes, int ranks);

// How many times a GlooAllreduce has sized its context's send buffers in this process (for
// tests): at most once per context, before its first transfer of more than kUnsizedBytes after
// a message from a pinned buffer (see size_send_buffers in gloo_allreduce.cpp for why).
int send_buffer_sizings();

class GlooAllreduce {
 public:
  // timeout bounds each allreduce (the group's timeout).
  GlooAllreduce(std::shared_ptr<gloo::Context> context, comm::Duration timeout);
  // Destroys the cached algorithms, which hold buffers registered with the context's pairs.
  ~GlooAllreduce();
  GlooAllreduce(const GlooAllreduce&) = delete;
  GlooAllreduce& operator=(const GlooAllreduce&) = delete;

  // In place over the context's ranks with choose_gloo_algorithm(requested, ...); tag is the
  // collective's sequence number (used by kRing). kAvg divides the sum by the context's size.
  void allreduce(std::span<float> data, comm::ReduceOp op, comm::AllreduceAlgorithm requested,
                 uint32_t tag);
  void allreduce(std::span<double> data, comm::ReduceOp op, comm::AllreduceAlgorithm requested,
                 uint32_t tag);

  // Before every other collective over the context (broadcast, allgather, the ring exchange),
  // with the bytes of its largest message: sizes the pairs' send buffers if a pinned message may
  // have left them small. Collective: every rank passes the same bytes.
  void prepare_unbound(size_t bytes) { prepare(bytes, false); }

  // Messages up to this size never wait for the send buffers to be sized: they fit the smallest
  // buffer a pinned message leaves (the kernel's minimum, 4,608 bytes on Linux).
  static constexpr size_t kUnsizedBytes = 4096;

 private:
  class Cache;  // Gloo algorithm objects kept per (type, count, op, algorithm)
  template <typename T>
  void allreduce_impl(std::span<T> data, comm::ReduceOp op, comm::AllreduceAlgorithm requested,
                      uint32_t tag);

  // Sizes the send buffers before a transfer of `bytes` (pinned: from the cache) when it needs it.
  void prepare(size_t bytes, bool pinned);

  const std::shared_ptr<gloo::Context> context_;
  const comm::Duration timeout_;
  std::unique_ptr<Cache> cache_;
  bool pinned_used_ = false;         // a cached algorithm ran on the context
  bool send_buffers_sized_ = false;  // size_send_buffers has run on the context
};

}  // namespace hsgd::detail
