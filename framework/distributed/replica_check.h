#pragma once
// check_same_tensors: the collective check that every rank of a group holds the same tensors
// (names, shapes and order), like torch DDP's _verify_param_shape_across_processes. Run by
// DistributedDataParallel at construction (before it broadcasts rank 0's state), by the model
// averagers (their buffers at construction, what they average at their first averaging) and by
// AveragedReplicas.
//
// Why: a collective over one flat buffer of every tensor only needs the total sizes to agree.
// A model that differs between ranks would either abort inside Gloo (a message longer than the
// receive buffer) or, when the totals happen to match, silently mix unrelated weights.
//
// Cost: an agreement check (comm/process_group/agreement.h) of the entries' description: one
// allgather of 2 int64 per rank (a hash of the names, shapes and order, and its length). Only
// when those differ, every rank's description travels, so that the error names the first
// differing entry and the ranks with each version of it.
//
// same_values_on_all_ranks: the collective check that every rank holds the same VALUES, bit for
// bit, so that a broadcast of them (DDP's start) or a float32 averaging of them would change
// nothing. Cost: one allgather of a 64-bit fingerprint (FNV-1a over the values' bytes) per rank.
// Two different values give the same fingerprint with probability about 2^-64 per pair of ranks.
//
// Usage:
//   auto entries = detail::describe_module(*model);       // parameters, then buffers
//   detail::check_same_tensors(*pg, "DistributedDataParallel", entries);
//   // false: some rank holds other values, and rank 0's must be broadcast
//   const bool equal = detail::same_values_on_all_ranks(*pg, model->parameters(), "fingerprint");

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm/process_group/process_group.h"
#include "framework/nn/module.h"
#include "framework/tensor/tensor.h"

namespace hsgd::distributed::detail {

// One tensor as the check compares it.
struct TensorEntry {
  std::string kind;  // "parameter", "buffer", "tensor"
  std::string name;  // "features.0.weight"; may be "" (entries are then named by position)
  Shape shape;
  bool frozen = false;  // a parameter without requires_grad (DDP does not synchronise it)
};

// The module's named_parameters() then named_buffers(), in order.
std::vector<TensorEntry> describe_module(const nn::Module& module);
// Unnamed tensors: entries "<kind> <i>".
std::vector<TensorEntry> describe_tensors(const std::vector<Tensor>& tensors, const char* kind);

// Collective over pg (every rank calls it with its own entries; a group of one returns at once).
// Throws hsgd::InvalidArgument on EVERY rank when the entries differ, e.g.
//   "DistributedDataParallel: the model differs between the ranks of group 'world': parameter 2
//    'conv2.weight' has shape [64, 32, 3, 3] on ranks 0, 2-3 and [80, 32, 3, 3] on rank 1; ..."
// who names the caller. Throws hsgd::Timeout / hsgd::CommError if the allgather fails.
void check_same_tensors(comm::ProcessGroup& pg, const std::string& who,
                        const std::vector<TensorEntry>& entries, const char* what = "the model");

// FNV-1a over the bytes of every value of tensors, in order (local, no communication).
uint64_t values_fingerprint(const std::vector<Tensor>& tensors);

// Collective over pg: whether every rank's values_fingerprint(tensors) equals this rank's (the
// same answer on every rank). A group of one returns true at once. label names the allgather in
// failure reports; throws hsgd::Timeout / hsgd::CommError when it fails.
bool same_values_on_all_ranks(comm::ProcessGroup& pg, const std::vector<Tensor>& tensors,
                              std::string_view label);

}  // namespace hsgd::distributed::detail
