#include "framework/data/dataset.h"

#include <algorithm>

#include "comm/error.h"

namespace hsgd::data {

int64_t Batch::size() const {
  if (inputs.defined() && inputs.dim() > 0) return inputs.size(0);
  if (input_ids.defined() && input_ids.dim() > 0) return input_ids.size(0);
  return static_cast<int64_t>(targets.size());
}

InMemoryDataset::InMemoryDataset(std::vector<float> values, std::vector<int64_t> targets,
                                 Shape example_shape)
    : values_(std::move(values)),
      targets_(std::move(targets)),
      example_shape_(std::move(example_shape)),
      example_numel_(shape_numel(example_shape_)) {
  HSGD_CHECK_EQ(values_.size(), targets_.size() * static_cast<size_t>(example_numel_),
                "InMemoryDataset: number of values vs targets times example size ",
                shape_str(example_shape_));
}

Batch InMemoryDataset::get_batch(const std::vector<int64_t>& indices) const {
  const auto b = static_cast<int64_t>(indices.size());
  Shape shape = {b};
  shape.insert(shape.end(), example_shape_.begin(), example_shape_.end());
  std::vector<float> out(static_cast<size_t>(b * example_numel_));  // (B, example...)
  Batch batch;
  batch.targets.reserve(indices.size());
  for (int64_t i = 0; i < b; ++i) {
    const int64_t index = indices[static_cast<size_t>(i)];
    HSGD_CHECK(index >= 0 && index < size(), "InMemoryDataset: index ", index, " out of range [0, ",
               size(), ")");
    std::copy_n(values_.begin() + index * example_numel_, example_numel_,
                out.begin() + i * example_numel_);
    batch.targets.push_back(targets_[static_cast<size_t>(index)]);
  }
  batch.inputs = from_vector(std::move(out), shape);
  return batch;
}

}  // namespace hsgd::data
