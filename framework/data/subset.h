#pragma once
// Subset: the examples of another data set at given indices, in that order (torch's
// torch.utils.data.Subset). first_n(dataset, n) is the first n examples, e.g. a quick run on
// 2,000 Fashion-MNIST images.
//
// Usage:
//   auto small = data::first_n(dataset, 2000);   // examples 0..1999 of dataset
//
// Errors (InvalidArgument naming the value): a null data set, an index outside the parent's
// [0, size()), n outside [0, parent size].

#include <cstdint>
#include <memory>
#include <vector>

#include "framework/data/dataset.h"

namespace hsgd::data {

class Subset : public Dataset {
 public:
  Subset(std::shared_ptr<const Dataset> parent, std::vector<int64_t> indices);

  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  Shape example_shape() const override { return parent_->example_shape(); }
  // Example i of the subset is example indices[i] of the parent.
  Batch get_batch(const std::vector<int64_t>& indices) const override;

 private:
  const std::shared_ptr<const Dataset> parent_;
  const std::vector<int64_t> indices_;
};

std::shared_ptr<const Dataset> first_n(std::shared_ptr<const Dataset> dataset, int64_t n);

}  // namespace hsgd::data
