// The collectives of ProcessGroup: each builds its fingerprint and queues the Gloo (or shared
// memory) operation; construction, failure reports and shutdown are in process_group.cpp.

#include <gloo/allgather.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>

#include "comm/error.h"
#include "comm/process_group/detail/collective_fingerprint.h"
#include "comm/process_group/detail/gloo_allreduce.h"
#include "comm/process_group/detail/two_level_allreduce.h"
#include "comm/process_group/process_group.h"
#include "comm/process_group/shm_allreduce.h"

namespace hsgd::comm {

using hsgd::detail::CollectiveFingerprint;

template <typename T>
std::shared_ptr<Work> ProcessGroup::allreduce_impl(std::span<T> data, ReduceOp op, const char* type,
                                                   std::string_view label, RunOn run_on) {
  CollectiveFingerprint fp{
      .kind = "allreduce", .dtype = type, .count = data.size(), .args = to_string(op)};
  fp.label = label;
  return enqueue(std::move(fp), run_on, [this, data, op](uint32_t tag) {
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
                                              std::string_view label, RunOn run_on) {
  return allreduce_impl(data, op, "float", label, run_on);
}

std::shared_ptr<Work> ProcessGroup::allreduce(std::span<double> data, ReduceOp op,
                                              std::string_view label, RunOn run_on) {
  return allreduce_impl(data, op, "double", label, run_on);
}

template <typename T>
std::shared_ptr<Work> ProcessGroup::broadcast_impl(std::span<T> data, int root, const char* type,
                                                   std::string_view label, RunOn run_on) {
  HSGD_CHECK(root >= 0 && root < size(), "ProcessGroup '", name(), "': broadcast root ", root,
             " must be a rank of the group, in [0, ", size(), ")");
  CollectiveFingerprint fp{.kind = "broadcast",
                           .dtype = type,
                           .count = data.size(),
                           .args = "root " + std::to_string(root)};
  fp.label = label;
  return enqueue(std::move(fp), run_on, [this, data, root](uint32_t tag) {
    if (size() == 1 || data.empty()) return;
    gloo_allreduce_->prepare_unbound(data.size_bytes());
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(data.data(), data.size());
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    gloo::broadcast(opts);
  });
}

std::shared_ptr<Work> ProcessGroup::broadcast(std::span<float> data, int root,
                                              std::string_view label, RunOn run_on) {
  return broadcast_impl(data, root, "float", label, run_on);
}
std::shared_ptr<Work> ProcessGroup::broadcast(std::span<double> data, int root,
                                              std::string_view label, RunOn run_on) {
  return broadcast_impl(data, root, "double", label, run_on);
}
std::shared_ptr<Work> ProcessGroup::broadcast(std::span<int64_t> data, int root,
                                              std::string_view label, RunOn run_on) {
  return broadcast_impl(data, root, "int64", label, run_on);
}

template <typename T>
std::shared_ptr<Work> ProcessGroup::allgather_impl(std::span<const T> in, std::span<T> out,
                                                   const char* type, std::string_view label,
                                                   RunOn run_on) {
  HSGD_CHECK(out.size() == in.size() * static_cast<size_t>(size()), "ProcessGroup '", name(),
             "': allgather output has ", out.size(),
             " elements; expected size() * input = ", size(), " * ", in.size());
  CollectiveFingerprint fp{.kind = "allgather", .dtype = type, .count = in.size()};
  fp.label = label;
  return enqueue(std::move(fp), run_on, [this, in, out](uint32_t tag) {
    if (size() == 1 || in.empty()) {
      std::copy(in.begin(), in.end(), out.begin());
      return;
    }
    gloo_allreduce_->prepare_unbound(in.size_bytes());
    gloo::AllgatherOptions opts(context_);
    opts.setInput(const_cast<T*>(in.data()), in.size());  // Gloo only reads the input
    opts.setOutput(out.data(), out.size());
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    gloo::allgather(opts);
  });
}

std::shared_ptr<Work> ProcessGroup::allgather(std::span<const float> in, std::span<float> out,
                                              std::string_view label, RunOn run_on) {
  return allgather_impl(in, out, "float", label, run_on);
}
std::shared_ptr<Work> ProcessGroup::allgather(std::span<const int64_t> in, std::span<int64_t> out,
                                              std::string_view label, RunOn run_on) {
  return allgather_impl(in, out, "int64", label, run_on);
}

// The lengths travel first, under the collective's tag; the bytes then under the tag with the
// top bit flipped. That bit is one of the 12 shape-hash bits of a tag (gloo_tag), so the second
// tag differs from the first, and from every neighbouring collective's by its sequence bits.
constexpr uint32_t kSecondPhaseTagBit = 1u << 31;

std::shared_ptr<Work> ProcessGroup::allgather_bytes(std::string_view in,
                                                    std::vector<std::string>& out,
                                                    std::string_view label, RunOn run_on) {
  // Lengths may differ between ranks, so the fingerprint holds none (no count, no type).
  CollectiveFingerprint fp{.kind = "allgather of bytes"};
  fp.label = label;
  return enqueue(std::move(fp), run_on, [this, in, &out](uint32_t tag) {
    out.assign(static_cast<size_t>(size()), std::string());
    if (size() == 1) {
      out[0] = in;
      return;
    }
    const int64_t mine = static_cast<int64_t>(in.size());
    std::vector<int64_t> lengths(static_cast<size_t>(size()));
    gloo::AllgatherOptions sizes(context_);
    sizes.setInput(const_cast<int64_t*>(&mine), 1);  // Gloo only reads the input
    sizes.setOutput(lengths.data(), lengths.size());
    sizes.setTag(tag);
    sizes.setTimeout(options_.timeout);
    gloo::allgather(sizes);
    const size_t longest = static_cast<size_t>(*std::max_element(lengths.begin(), lengths.end()));
    if (longest == 0) return;
    gloo_allreduce_->prepare_unbound(longest);
    std::vector<char> padded(longest, '\0');
    std::copy(in.begin(), in.end(), padded.begin());
    std::vector<char> all(longest * static_cast<size_t>(size()));
    gloo::AllgatherOptions bytes(context_);
    bytes.setInput(padded.data(), padded.size());
    bytes.setOutput(all.data(), all.size());
    bytes.setTag(tag ^ kSecondPhaseTagBit);
    bytes.setTimeout(options_.timeout);
    gloo::allgather(bytes);
    for (size_t r = 0; r < out.size(); ++r) {
      out[r].assign(all.data() + r * longest, static_cast<size_t>(lengths[r]));
    }
  });
}

// Gloo's collectives use slot prefixes 0x01-0x08 (gloo/types.h); the ring exchange its own.
constexpr uint8_t kRingExchangeSlotPrefix = 0x21;

std::shared_ptr<Work> ProcessGroup::ring_exchange(std::span<const int64_t> send,
                                                  std::span<int64_t> recv, std::string_view label,
                                                  RunOn run_on) {
  HSGD_CHECK(send.size() == recv.size(), "ProcessGroup '", name(), "': ring_exchange sends ",
             send.size(), " elements but receives ", recv.size(), "; expected the same count");
  CollectiveFingerprint fp{.kind = "ring exchange", .dtype = "int64", .count = send.size()};
  fp.label = label;
  return enqueue(std::move(fp), run_on, [this, send, recv](uint32_t tag) {
    if (size() == 1 || send.empty()) {
      std::copy(send.begin(), send.end(), recv.begin());
      return;
    }
    gloo_allreduce_->prepare_unbound(send.size_bytes());
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

std::shared_ptr<Work> ProcessGroup::barrier(std::string_view label, RunOn run_on) {
  CollectiveFingerprint fp{.kind = "barrier"};
  fp.label = label;
  return enqueue_barrier(std::move(fp), run_on);
}

std::shared_ptr<Work> ProcessGroup::named_barrier(std::string_view name, RunOn run_on) {
  // The name is in args (part of the shape hash and of the Gloo tag) and is the label.
  CollectiveFingerprint fp{.kind = "barrier", .args = std::string(name)};
  fp.label = name;
  return enqueue_barrier(std::move(fp), run_on);
}

std::shared_ptr<Work> ProcessGroup::enqueue_barrier(CollectiveFingerprint fp, RunOn run_on) {
  return enqueue(std::move(fp), run_on, [this](uint32_t tag) {
    if (size() == 1) return;
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    gloo::barrier(opts);
  });
}

}  // namespace hsgd::comm
