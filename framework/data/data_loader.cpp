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
  HSGD_CHECK(options_.prefetch >= 0, "DataLoader: prefetch ", options_.prefetch,
             " must be >= 0 (0: off)");
  HSGD_CHECK(options_.timeout.count() > 0, "DataLoader: timeout ", options_.timeout.count(),
             " ms must be positive");
  set_epoch(0);
}

DataLoader::~DataLoader() { stop_prefetch(); }

namespace {

// Batch i of an epoch whose order is `indices`: get_batch, then the transform.
Batch load_batch(const Dataset& dataset, const DataLoaderOptions& options,
                 const std::vector<int64_t>& indices, int64_t epoch, int64_t i) {
  const int64_t begin = i * options.batch_size;
  const int64_t end =
      std::min<int64_t>(begin + options.batch_size, static_cast<int64_t>(indices.size()));
  const std::vector<int64_t> batch_indices(indices.begin() + begin, indices.begin() + end);
  Batch out = dataset.get_batch(batch_indices);
  if (options.transform) options.transform(out, batch_indices, epoch);
  return out;
}

}  // namespace

void DataLoader::set_epoch(int64_t epoch) {
  stop_prefetch();  // its batches are of the order being replaced
  if (epoch != epoch_) {
    resume_at_ = 0;
    offset_ = 0;
  }
  epoch_ = epoch;
  position_ = 0;
  partition();
}

void DataLoader::partition() {
  const int64_t n = dataset_->size();
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (options_.shuffle) {
    // Fisher-Yates with hsgd's Generator: the same permutation on every machine and rank.
    Generator gen(options_.seed + static_cast<uint64_t>(epoch_));
    for (int64_t i = n - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(i + 1)));
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
    }
  }
  const int64_t world = options_.world_size;
  const int64_t remaining = n - offset_;
  indices_.clear();
  if (world == 1 || remaining == 0) {
    indices_.assign(order.begin() + offset_, order.end());
    return;
  }
  // Pad by cycling through the remainder so every rank gets ceil(remaining / world) samples.
  const int64_t per_rank = (remaining + world - 1) / world;
  indices_.reserve(static_cast<size_t>(per_rank));
  for (int64_t k = 0; k < per_rank; ++k) {
    const int64_t position = k * world + options_.rank;
    indices_.push_back(order[static_cast<size_t>(offset_ + position % remaining)]);
  }
}

int64_t DataLoader::batches_of(int64_t remaining, int64_t world) const {
  const int64_t per_rank = (remaining + world - 1) / world;
  return options_.drop_last ? per_rank / options_.batch_size
                            : (per_rank + options_.batch_size - 1) / options_.batch_size;
}

int64_t DataLoader::global_position(int64_t offset, int64_t position, int64_t world) const {
  // Before the partition's last batch every batch is full and none holds padding; after it the
  // partition is finished.
  if (position >= batches_of(dataset_->size() - offset, world)) return dataset_->size();
  return offset + position * options_.batch_size * world;
}

void DataLoader::repartition(int rank, int world_size) {
  HSGD_CHECK(world_size >= 1, "DataLoader::repartition: world_size ", world_size,
             " must be at least 1");
  HSGD_CHECK(rank >= 0 && rank < world_size, "DataLoader::repartition: rank ", rank,
             " must be in [0, ", world_size, ")");
  stop_prefetch();  // its batches are of the partition being replaced
  offset_ = global_position(offset_, position_, options_.world_size);
  options_.rank = rank;
  options_.world_size = world_size;
  position_ = 0;
  resume_at_ = 0;
  partition();
}

int64_t DataLoader::num_batches() const {
  return batches_of(dataset_->size() - offset_, options_.world_size);
}

Batch DataLoader::batch(int64_t i) const {
  HSGD_CHECK(i >= 0 && i < num_batches(), "DataLoader: batch index ", i, " out of range [0, ",
             num_batches(), ")");
  return load_batch(*dataset_, options_, indices_, epoch_, i);
}

Batch DataLoader::fetch(int64_t i) const {
  if (prefetcher_ != nullptr && prefetcher_->next_index() == i) return prefetcher_->next();
  return batch(i);
}

DataLoader::Iterator DataLoader::begin() const {
  stop_prefetch();  // a pass left unfinished
  const int64_t start = std::min(resume_at_, num_batches());
  resume_at_ = 0;
  position_ = start;
  if (options_.prefetch > 0 && start < num_batches()) {
    // The worker gets its own copy of what a batch depends on, so nothing it reads changes
    // under it.
    prefetcher_ = std::make_unique<BatchPrefetcher>(
        [dataset = dataset_, options = options_, indices = indices_, epoch = epoch_](int64_t i) {
          return load_batch(*dataset, options, indices, epoch, i);
        },
        start, num_batches(), options_.prefetch, options_.timeout);
  }
  return Iterator(this, start);
}

StateDict DataLoader::state_dict() const {
  StateDict state;
  state.set("epoch", epoch_);
  state.set("position", position_);
  state.set("batch_size", options_.batch_size);
  state.set("world_size", int64_t{options_.world_size});
  state.set("dataset_size", dataset_->size());
  // Absent at offset 0, so the state of a loader that never repartitioned has the same keys on
  // every version of this class.
  if (offset_ > 0) state.set("offset", offset_);
  return state;
}

void DataLoader::load_state_dict(const StateDict& state) {
  const int64_t epoch = state.get_int("epoch");
  const int64_t position = state.get_int("position");
  const int64_t batch_size = state.get_int("batch_size");
  const int64_t saved_world = state.get_int("world_size");
  const int64_t dataset_size = state.get_int("dataset_size");
  const int64_t saved_offset = state.contains("offset") ? state.get_int("offset") : 0;
  HSGD_CHECK(batch_size == options_.batch_size,
             "DataLoader::load_state_dict: the state has "
             "batch_size ",
             batch_size, ", this loader ", options_.batch_size);
  HSGD_CHECK(dataset_size == dataset_->size(),
             "DataLoader::load_state_dict: the state has a "
             "data set of ",
             dataset_size, " examples, this loader ", dataset_->size());
  HSGD_CHECK(epoch >= 0 && saved_world >= 1, "DataLoader::load_state_dict: epoch ", epoch,
             " and world_size ", saved_world, " must be >= 0 and >= 1");
  HSGD_CHECK(saved_offset >= 0 && saved_offset <= dataset_size,
             "DataLoader::load_state_dict: offset ", saved_offset, " outside [0, ", dataset_size,
             "]");
  const int64_t saved_batches = batches_of(dataset_size - saved_offset, saved_world);
  HSGD_CHECK(position >= 0 && position <= saved_batches, "DataLoader::load_state_dict: position ",
             position, " outside [0, ", saved_batches, "] batches of epoch ", epoch, " at offset ",
             saved_offset, " on world size ", saved_world);
  int64_t offset = saved_offset;
  int64_t resume = position;
  if (saved_world != options_.world_size) {
    offset = global_position(saved_offset, position, saved_world);
    resume = 0;
  }
  stop_prefetch();
  epoch_ = epoch;
  offset_ = offset;
  partition();
  resume_at_ = resume;
  position_ = resume;
}

DataLoader::Iterator::Iterator(const DataLoader* loader, int64_t index)
    : loader_(loader), index_(index) {
  load();
}

void DataLoader::Iterator::load() {
  if (index_ < loader_->num_batches()) {
    current_ = loader_->fetch(index_);
    loader_->position_ = index_ + 1;
  }
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  ++index_;
  load();
  return *this;
}

}  // namespace hsgd::data
