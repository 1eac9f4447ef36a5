#include "framework/data/text.h"

#include <fstream>
#include <iterator>

#include "comm/error.h"

namespace hsgd::data {

std::vector<int64_t> byte_tokens(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  HSGD_CHECK(in.good(), "byte_tokens: cannot read '", path.string(), "'");
  const std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)),
                                         std::istreambuf_iterator<char>());
  HSGD_CHECK(!bytes.empty(), "byte_tokens: '", path.string(), "' is empty");
  return std::vector<int64_t>(bytes.begin(), bytes.end());
}

NextTokenDataset::NextTokenDataset(std::shared_ptr<const std::vector<int64_t>> tokens,
                                   int64_t begin, int64_t end, int64_t context, int64_t stride,
                                   int64_t vocab_size)
    : tokens_(std::move(tokens)),
      begin_(begin),
      context_(context),
      stride_(stride),
      vocab_size_(vocab_size),
      size_(0) {
  HSGD_CHECK(tokens_ != nullptr, "NextTokenDataset: the tokens are null");
  HSGD_CHECK(context >= 1 && stride >= 1, "NextTokenDataset: context ", context, " and stride ",
             stride, " must be at least 1");
  HSGD_CHECK(vocab_size >= 1, "NextTokenDataset: vocab_size ", vocab_size, " must be at least 1");
  const auto n = static_cast<int64_t>(tokens_->size());
  HSGD_CHECK(begin >= 0 && begin <= end && end <= n, "NextTokenDataset: range [", begin, ", ", end,
             ") is outside the ", n, " tokens");
  for (int64_t i = begin; i < end; ++i) {
    const int64_t t = (*tokens_)[static_cast<size_t>(i)];
    HSGD_CHECK(t >= 0 && t < vocab_size, "NextTokenDataset: token ", i, " is ", t,
               ", expected a value in [0, ", vocab_size, ")");
  }
  if (end - begin >= context + 1) size_ = (end - begin - context - 1) / stride + 1;
}

Batch NextTokenDataset::get_batch(const std::vector<int64_t>& indices) const {
  const auto b = static_cast<int64_t>(indices.size());
  std::vector<int64_t> inputs, targets;
  inputs.reserve(static_cast<size_t>(b * context_));
  targets.reserve(static_cast<size_t>(b * context_));
  for (size_t k = 0; k < indices.size(); ++k) {
    const int64_t i = indices[k];
    HSGD_CHECK(i >= 0 && i < size_, "NextTokenDataset: example index ", i, " (batch position ", k,
               ") is outside [0, ", size_, ")");
    const auto first = tokens_->begin() + begin_ + i * stride_;
    inputs.insert(inputs.end(), first, first + context_);
    targets.insert(targets.end(), first + 1, first + context_ + 1);
  }
  Batch batch;
  batch.input_ids = IndexTensor(std::move(inputs), {b, context_});
  batch.target_ids = IndexTensor(std::move(targets), {b, context_});
  return batch;
}

}  // namespace hsgd::data
