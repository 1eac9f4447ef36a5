#include "comm/process_group/detail/two_level_allreduce.h"

#include <algorithm>
#include <limits>

#include "comm/error.h"
#include "comm/process_group/detail/child_group.h"
#include "comm/process_group/shm_allreduce.h"
#include "comm/store/store_barrier.h"

namespace hsgd::detail {

using comm::Bytes;
using comm::ReduceOp;

// Members are grouped by node in order of their first group rank.
std::unique_ptr<TwoLevelAllreduce> TwoLevelAllreduce::connect(
    const comm::ProcessGroup::Options& group, const std::vector<Bytes>& identities) {
  const int size = static_cast<int>(group.ranks.size());
  std::vector<Bytes> node_ids;
  std::vector<std::vector<int>> node_members;
  for (int r = 0; r < size; ++r) {
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
  if (node_members.size() < 2 || per_node < 2 ||
      per_node > static_cast<size_t>(comm::ShmAllreduce::kMaxRanks) || !uniform) {
    return nullptr;
  }
  int my_node = 0, my_index = 0;
  for (size_t k = 0; k < node_members.size(); ++k) {
    auto it = std::find(node_members[k].begin(), node_members[k].end(), group.rank);
    if (it != node_members[k].end()) {
      my_node = static_cast<int>(k);
      my_index = static_cast<int>(it - node_members[k].begin());
    }
  }
  const std::string node_name = group.name + "/node" + std::to_string(my_node);
  auto local = comm::ShmAllreduce::connect(
      *group.store, group.key_prefix + "node" + std::to_string(my_node) + "/shm/", my_index,
      static_cast<int>(per_node), group.timeout, node_name);
  // Every rank votes whether its node's segment is mapped; all use the plan or none does.
  const std::string agreed = group.key_prefix + "two_level/";
  comm::store_barrier(*group.store, agreed, group.rank, size, group.timeout,
                      {.value = comm::to_bytes(local ? "1" : "0"),
                       .what = str_cat("two-level allreduce setup of group '", group.name,
                                       "' (rank ", group.rank, " of ", size, ")"),
                       .global_ranks = group.ranks});
  const auto votes = group.store->multi_get(comm::store_barrier_keys(agreed, size), group.timeout);
  if (!std::all_of(votes.begin(), votes.end(),
                   [](const Bytes& v) { return comm::to_string(v) == "1"; })) {
    return nullptr;
  }
  std::vector<int> cross_ranks;
  for (const auto& members : node_members) {
    cross_ranks.push_back(group.ranks[static_cast<size_t>(members[static_cast<size_t>(my_index)])]);
  }
  comm::ProcessGroup::Options cross =
      child_options(group, "cross" + std::to_string(my_index), my_node, std::move(cross_ranks));
  cross.shared_memory = false;  // one member per node
  return std::unique_ptr<TwoLevelAllreduce>(new TwoLevelAllreduce(
      std::move(local), std::make_shared<comm::ProcessGroup>(std::move(cross)), my_index,
      static_cast<int>(per_node), size, group.timeout));
}

TwoLevelAllreduce::TwoLevelAllreduce(std::unique_ptr<comm::ShmAllreduce> local,
                                     std::shared_ptr<comm::ProcessGroup> cross, int index,
                                     int per_node, int group_size, comm::Duration timeout)
    : local_(std::move(local)),
      cross_(std::move(cross)),
      index_(index),
      per_node_(per_node),
      group_size_(group_size),
      timeout_(timeout) {}

TwoLevelAllreduce::~TwoLevelAllreduce() = default;

template <typename T>
void TwoLevelAllreduce::allreduce_impl(std::span<T> data, ReduceOp op) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  const ReduceOp inner = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  local_->allreduce(data, inner, deadline);  // 1. within the node
  const size_t shards = static_cast<size_t>(per_node_);
  const size_t per = (data.size() + shards - 1) / shards;
  const size_t begin = std::min(data.size(), per * static_cast<size_t>(index_));
  const size_t end = std::min(data.size(), begin + per);
  // 2. across, on this thread (the group's task), which waits for it anyway
  cross_->allreduce(data.subspan(begin, end - begin), inner, {}, comm::RunOn::kCaller)
      ->wait(timeout_);
  const T identity = inner == ReduceOp::kMin   ? std::numeric_limits<T>::infinity()
                     : inner == ReduceOp::kMax ? -std::numeric_limits<T>::infinity()
                                               : T(0);
  std::fill(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(begin), identity);
  std::fill(data.begin() + static_cast<std::ptrdiff_t>(end), data.end(), identity);
  local_->allreduce(data, inner, deadline);  // 3. assemble the shards
  if (op == ReduceOp::kAvg) {
    const T n = static_cast<T>(group_size_);
    for (auto& x : data) x /= n;
  }
}

void TwoLevelAllreduce::abort() {
  local_->abort();
  if (cross_ != nullptr) cross_->abort_transport();
}

void TwoLevelAllreduce::allreduce(std::span<float> data, ReduceOp op) { allreduce_impl(data, op); }

void TwoLevelAllreduce::allreduce(std::span<double> data, ReduceOp op) { allreduce_impl(data, op); }

}  // namespace hsgd::detail
