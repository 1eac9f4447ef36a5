#include "framework/data/data_loader.h"

#include <algorithm>
#include <numeric>

#include "comm/error.h"

namespace hsgd::data {

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  HSGD_CHECK(dataset_ != nullptr, "DataLoader: dataset is null");
  HSGD_CHECK(options_.batch_size >= 1, "DataLoader: batch_size ", options_.batch_size,
             " must be at least 1");
  HSGD_CHECK(options_.world_size >= 1, "DataLoader: world_size ", options_.world_size,
             " must be at least 1");
  HSGD_CHECK(options_.rank >= 0 && options_.rank < options_.world_size, "DataLoader: rank ",
             options_.rank, " must be in [0, ", options_.world_size, ")");
  set_epoch(0);
}

void DataLoader::set_epoch(int64_t epoch) {
  epoch_ = epoch;
  const int64_t n = dataset_->size();
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (options_.shuffle) {
    // Fisher-Yates with hsgd's Generator: the same permutation on every machine and rank.
    Generator gen(options_.seed + static_cast<uint64_t>(epoch));
    for (int64_t i = n - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(i + 1)));
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
    }
  }
  const int64_t world = options_.world_size;
  indices_.clear();
  if (world == 1 || n == 0) {
    indices_ = std::move(order);
    return;
  }
  // Pad by cycling through the order so every rank gets ceil(n / world) samples.
  const int64_t per_rank = (n + world - 1) / world;
  for (int64_t k = 0; k < per_rank; ++k) {
    const int64_t position = k * world + options_.rank;
    indices_.push_back(order[static_cast<size_t>(position % n)]);
  }
}

int64_t DataLoader::num_batches() const {
  const auto n = static_cast<int64_t>(indices_.size());
  return options_.drop_last ? n / options_.batch_size
                            : (n + options_.batch_size - 1) / options_.batch_size;
}

Batch DataLoader::batch(int64_t i) const {
  HSGD_CHECK(i >= 0 && i < num_batches(), "DataLoader: batch index ", i, " out of range [0, ",
             num_batches(), ")");
  const int64_t begin = i * options_.batch_size;
  const int64_t end =
      std::min<int64_t>(begin + options_.batch_size, static_cast<int64_t>(indices_.size()));
  return dataset_->get_batch(
      std::vector<int64_t>(indices_.begin() + begin, indices_.begin() + end));
}

DataLoader::Iterator::Iterator(const DataLoader* loader, int64_t index)
    : loader_(loader), index_(index) {
  load();
}

void DataLoader::Iterator::load() {
  if (index_ < loader_->num_batches()) current_ = loader_->batch(index_);
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  ++index_;
  load();
  return *this;
}

}  // namespace hsgd::data
