#include "framework/checkpoint/detail/resharding.h"

#include <variant>

#include "comm/error.h"

namespace hsgd::checkpoint::detail {
namespace {

// The element-wise mean of tensors of one shape, accumulated in double (equal tensors average
// to themselves exactly).
Tensor mean_of(const std::vector<Tensor>& tensors, const std::string& key) {
  const Tensor& first = tensors.front();
  std::vector<double> sum(static_cast<size_t>(first.numel()), 0.0);
  for (const Tensor& t : tensors) {
    HSGD_CHECK(t.shape() == first.shape(), "checkpoint: entry '", key,
               "' has different shapes on the saved ranks");
    const float* data = t.data();
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += data[i];
  }
  Tensor out = zeros(first.shape());
  float* data = out.data();
  for (size_t i = 0; i < sum.size(); ++i) {
    data[i] = static_cast<float>(sum[i] / static_cast<double>(tensors.size()));
  }
  return out;
}

}  // namespace

std::vector<int> saved_ranks_to_read(int saved_world, int world, int rank) {
  if (saved_world == world) return {rank};
  std::vector<int> ranks;
  for (int r = 0; r < saved_world; ++r) ranks.push_back(r);
  return ranks;
}

StateDict reshard(std::vector<StateDict> states, int rank, const std::string& path) {
  if (states.size() == 1) return std::move(states.front());
  StateDict out;
  // Averaged tensors; other values from saved rank (rank % saved world).
  const StateDict& own = states[static_cast<size_t>(rank) % states.size()];
  for (const auto& [key, value] : own.entries()) {
    if (!std::holds_alternative<Tensor>(value)) {
      out.set(key, value);
      continue;
    }
    std::vector<Tensor> all;
    for (const StateDict& s : states) {
      const StateValue* v = s.find(key);
      HSGD_CHECK(v != nullptr && std::holds_alternative<Tensor>(*v), "checkpoint: '", path,
                 "': entry '", key, "' is not a tensor on every saved rank");
      all.push_back(std::get<Tensor>(*v));
    }
    out.set(key, mean_of(all, key));
  }
  return out;
}

}  // namespace hsgd::checkpoint::detail
