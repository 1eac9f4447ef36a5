// ModelAverager::average_replicas (averagers.h): the mean of the replicas over the whole group,
// sent as the top level sends its averagings.

#include <algorithm>
#include <iterator>

#include "comm/error.h"
#include "framework/distributed/flat_buffer.h"
#include "framework/distributed/model_averaging/averagers.h"
#include "framework/distributed/model_averaging/averaging_level.h"
#include "framework/distributed/model_averaging/compressed_average.h"

namespace hsgd::distributed {

std::vector<Tensor> ModelAverager::average_replicas(const std::vector<Tensor>& params) {
  if (levels_.empty() || pg_->size() == 1) return {};
  const size_t top = levels_.size() - 1;
  const LevelOptions& options = level_options_[top];
  const std::vector<Unit>& units = levels_[top];
  // Every condition below is the same on every rank: the options and the group agree
  // (construction), the units' anchors follow the same schedule, and the tensors' shapes were
  // checked at the first averaging.
  if (options.compression == Compression::kNone || units.front()->group() == nullptr ||
      units.front()->group()->size() != pg_->size() ||
      std::any_of(units.begin(), units.end(), [](const Unit& u) { return !u->has_anchor(); })) {
    return {};
  }
  // The parameters with a gradient; before any backward (a run resumed after its last step)
  // every parameter, which the anchors' sizes below accept only if the level averaged them all.
  std::vector<Tensor> tensors = get_params_to_average(params);
  if (tensors.empty()) {
    std::copy_if(params.begin(), params.end(), std::back_inserter(tensors),
                 [](const Tensor& t) { return t.defined(); });
  }
  std::vector<int64_t> sizes;
  sizes.reserve(tensors.size());
  for (const Tensor& t : tensors) sizes.push_back(t.numel());
  const int64_t n_params = flat_numel(tensors);
  tensors.insert(tensors.end(), options_.average_buffers.begin(), options_.average_buffers.end());
  const int64_t n = flat_numel(tensors);
  // The level's parts of x, cut as pack() cuts them (a pure function of the sizes).
  std::vector<detail::Fragment> parts = {{.offset = 0, .size = n, .n_params = n_params}};
  if (units.size() > 1) {
    if (static_cast<int64_t>(sizes.size()) < static_cast<int64_t>(units.size())) return {};
    parts = detail::split_fragments(sizes, n - n_params, static_cast<int64_t>(units.size()),
                                    class_name_);
  }
  for (size_t f = 0; f < units.size(); ++f) {
    if (static_cast<int64_t>(units[f]->anchor().size()) != parts[f].size) return {};
  }
  if (replicas_ == nullptr) {
    replicas_ = std::make_unique<detail::CompressedAverage>(pg_, options.compression,
                                                            options.compression_scale);
  }
  // One node: nothing would be rounded, and the float32 averaging is exact.
  if (replicas_->nodes() == 1) return {};
  // x is (n,) this rank's values; anchor (n,) the top level's A, part by part.
  std::vector<float> x(static_cast<size_t>(n)), anchor(static_cast<size_t>(n));
  flatten_into(tensors, x);
  for (size_t f = 0; f < units.size(); ++f) {
    const std::span<const float> a = units[f]->anchor();
    std::copy(a.begin(), a.end(), anchor.begin() + parts[f].offset);
  }
  // payload A - x in, D = mean(A - x) out; then A - D, the same bits on every rank. The buffers
  // (running statistics) are averaged exactly in float32 beside it, as the level averages them.
  const auto n_param_values = static_cast<size_t>(n_params);
  std::vector<float> payload(static_cast<size_t>(n));
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = anchor[i] - x[i];
  const float g = static_cast<float>(pg_->size());
  std::shared_ptr<comm::Work> buffers;
  if (n_param_values < payload.size()) {
    for (size_t i = n_param_values; i < payload.size(); ++i) payload[i] /= g;
    buffers = pg_->allreduce(std::span<float>(payload).subspan(n_param_values), comm::ReduceOp::kSum,
                             "average of the replicas' buffers");
  }
  replicas_->start(std::span<float>(payload).first(n_param_values), {});
  replicas_->wait();
  if (buffers) buffers->wait(pg_->timeout());
  for (size_t i = 0; i < x.size(); ++i) x[i] = anchor[i] - payload[i];
  unflatten_from(x, tensors);
  return tensors;
}

}  // namespace hsgd::distributed
