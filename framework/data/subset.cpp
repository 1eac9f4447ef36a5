#include "framework/data/subset.h"

#include <numeric>

#include "comm/error.h"

namespace hsgd::data {

Subset::Subset(std::shared_ptr<const Dataset> parent, std::vector<int64_t> indices)
    : parent_(std::move(parent)), indices_(std::move(indices)) {
  HSGD_CHECK(parent_ != nullptr, "Subset: the parent data set is null");
  for (size_t i = 0; i < indices_.size(); ++i) {
    HSGD_CHECK(indices_[i] >= 0 && indices_[i] < parent_->size(), "Subset: index ", indices_[i],
               " at position ", i, " is outside the parent's [0, ", parent_->size(), ")");
  }
}

Batch Subset::get_batch(const std::vector<int64_t>& indices) const {
  std::vector<int64_t> mapped;
  mapped.reserve(indices.size());
  for (int64_t i : indices) {
    HSGD_CHECK(i >= 0 && i < size(), "Subset: index ", i, " out of range [0, ", size(), ")");
    mapped.push_back(indices_[static_cast<size_t>(i)]);
  }
  return parent_->get_batch(mapped);
}

std::shared_ptr<const Dataset> first_n(std::shared_ptr<const Dataset> dataset, int64_t n) {
  HSGD_CHECK(dataset != nullptr, "first_n: the data set is null");
  HSGD_CHECK(n >= 0 && n <= dataset->size(), "first_n: ", n,
             " examples requested, the data set has ", dataset->size());
  std::vector<int64_t> indices(static_cast<size_t>(n));
  std::iota(indices.begin(), indices.end(), int64_t{0});
  return std::make_shared<Subset>(std::move(dataset), std::move(indices));
}

}  // namespace hsgd::data
