#include "framework/distributed/model_averaging/compressed_average.h"

#include <algorithm>
#include <utility>

#include "comm/error.h"
#include "comm/log.h"
#include "framework/distributed/model_averaging/compression.h"

namespace hsgd::distributed::detail {

CompressedAverage::CompressedAverage(const std::shared_ptr<comm::ProcessGroup>& group,
                                     Compression compression, float scale)
    : compression_(compression), scale_(scale), group_size_(group->size()) {
  HSGD_CHECK(compression != Compression::kNone && group->size() >= 2,
             "CompressedAverage: needs a compression and a group of >= 2 ranks, got ",
             to_string(compression), " over ", group->size());
  // Collective over group: every member then holds the same layout. Nodes in the order of
  // their lowest group rank, which is the leaders' rank order in their group (the ring order).
  std::vector<std::vector<int>> nodes = comm::gather_node_layout(*group).nodes();
  std::sort(nodes.begin(), nodes.end(),
            [](const auto& a, const auto& b) { return a.front() < b.front(); });
  nodes_ = static_cast<int>(nodes.size());
  std::vector<std::vector<int>> shared;  // nodes with >= 2 members of the group
  std::vector<int> leaders;
  for (const auto& members : nodes) {
    if (members.size() >= 2) shared.push_back(members);
    leaders.push_back(members.front());
    if (members.front() == group->rank()) leader_ = true;
  }
  // Collective over group, the same calls on every member.
  if (!shared.empty()) node_ = comm::new_subgroups_by_enumeration(group, shared).first;
  if (nodes_ >= 2) leaders_ = comm::new_group(group, leaders);
}

CompressedAverage::~CompressedAverage() {
  try {
    wait();
  } catch (const std::exception& e) {
    comm::logger()->warn("compressed averaging: the averaging in flight failed: {}", e.what());
  }
}

int64_t CompressedAverage::start(std::span<float> buffer, std::span<float> residual) {
  HSGD_CHECK(!in_flight_, "CompressedAverage: started while an averaging is in flight");
  HSGD_CHECK(residual.empty() || residual.size() == buffer.size(),
             "CompressedAverage: residual has ", residual.size(), " values, the buffer ",
             buffer.size());
  // 1. node sum (float32)
  if (node_ != nullptr) {
    node_
        ->allreduce(buffer, comm::ReduceOp::kSum, "compressed averaging: node sum",
                    comm::RunOn::kCaller)
        ->wait(node_->work_timeout());
  }
  in_flight_ = true;
  buffer_ = buffer;
  if (leaders_ == nullptr) return 0;
  // 2. 16-bit ring over the leaders, in the background
  job_ = std::async(std::launch::async, [this, buffer, residual] {
    ring(buffer, residual);
    ring_finished_at_ = std::chrono::steady_clock::now();
  });
  const auto c = static_cast<int64_t>((buffer.size() + nodes_ - 1) / nodes_);
  return 2 * (nodes_ - 1) * packed_words(compression_, c) * static_cast<int64_t>(sizeof(int64_t));
}

void CompressedAverage::wait() {
  if (!in_flight_) return;
  in_flight_ = false;
  if (job_.valid()) job_.get();
  // 3. the leader's T to its node
  if (node_ != nullptr) {
    if (!leader_) std::fill(buffer_.begin(), buffer_.end(), 0.0f);
    node_
        ->allreduce(buffer_, comm::ReduceOp::kSum, "compressed averaging: node result",
                    comm::RunOn::kCaller)
        ->wait(node_->work_timeout());
  }
  // 4. mean
  const auto g = static_cast<float>(group_size_);
  for (float& v : buffer_) v /= g;
}

void CompressedAverage::ring(std::span<float> buffer, std::span<float> residual) {
  const size_t n = buffer.size();
  const auto big_n = static_cast<size_t>(nodes_);
  const size_t c = (n + big_n - 1) / big_n;
  const auto words = static_cast<size_t>(packed_words(compression_, static_cast<int64_t>(c)));
  const int i = leaders_->rank();
  acc_.resize(c);
  send_.assign(words, 0);
  recv_.assign(words, 0);
  const auto chunk_of = [&](int k) {  // chunk k mod N of the buffer (maybe short or empty)
    const auto index = static_cast<size_t>(((k % nodes_) + nodes_) % nodes_);
    const size_t begin = std::min(n, index * c);
    return std::pair<size_t, size_t>{begin, std::min(n, begin + c) - begin};
  };
  // a (in acc_) -> q (in send_), updating the residual of the chunk.
  const auto encode_chunk = [&](size_t begin, size_t size) {
    std::fill(send_.begin(), send_.end(), 0);
    encode(compression_, scale_, std::span<const float>(acc_).first(size),
           residual.empty() ? std::span<float>() : residual.subspan(begin, size),
           std::span<int64_t>(send_).first(
               static_cast<size_t>(packed_words(compression_, static_cast<int64_t>(size)))));
  };
  const auto exchange = [&](const char* label) {
    leaders_->ring_exchange(send_, recv_, label, comm::RunOn::kCaller)
        ->wait(leaders_->work_timeout());
  };
  // Reduce-scatter: at step s send chunk i - s, receive chunk i - s - 1.
  for (int s = 0; s < nodes_ - 1; ++s) {
    const auto [begin, size] = chunk_of(i - s);
    if (s == 0) {
      std::copy_n(buffer.begin() + static_cast<std::ptrdiff_t>(begin), size, acc_.begin());
    } else {  // recv_ holds chunk i - s from the previous step
      std::fill(acc_.begin(), acc_.end(), 0.0f);
      decode_add(compression_, scale_, recv_, std::span<float>(acc_).first(size));
      for (size_t j = 0; j < size; ++j) acc_[j] += buffer[begin + j];
    }
    encode_chunk(begin, size);
    exchange("compressed averaging: reduce-scatter");
  }
  // The owned chunk i + 1: the last contribution, encoded once more for the allgather.
  {
    const auto [begin, size] = chunk_of(i + 1);
    std::fill(acc_.begin(), acc_.end(), 0.0f);
    decode_add(compression_, scale_, recv_, std::span<float>(acc_).first(size));
    for (size_t j = 0; j < size; ++j) acc_[j] += buffer[begin + j];
    encode_chunk(begin, size);
    auto out = buffer.subspan(begin, size);
    std::fill(out.begin(), out.end(), 0.0f);
    decode_add(compression_, scale_, send_, out);
  }
  // Allgather: at step s send chunk i + 1 - s (as received), receive chunk i - s.
  for (int s = 0; s < nodes_ - 1; ++s) {
    exchange("compressed averaging: allgather");
    const auto [begin, size] = chunk_of(i - s);
    auto out = buffer.subspan(begin, size);
    std::fill(out.begin(), out.end(), 0.0f);
    decode_add(compression_, scale_, recv_, out);
    std::swap(send_, recv_);
  }
}

}  // namespace hsgd::distributed::detail
