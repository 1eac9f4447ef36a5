#pragma once
// Token sequences for language models: a text as byte tokens, and NextTokenDataset, the windows
// of a token sequence with their next-token targets, as a Dataset that DataLoader shuffles,
// shards over ranks and resumes like any other.
//
// Example i of NextTokenDataset(tokens, begin, end, context, stride) is the window
//   input_ids  = tokens[s, s + context)          s = begin + i * stride
//   target_ids = tokens[s + 1, s + context + 1)  (each position's next token)
// for every window whose targets end by `end`: size() = (end - begin - context - 1) / stride + 1
// (0 when the range holds fewer than context + 1 tokens). stride = context gives disjoint
// windows (every token is a target once per epoch); a smaller stride overlaps them. A batch
// holds input_ids and target_ids of shape (B, context), and no float inputs or class targets.
//
// Usage:
//   auto tokens = std::make_shared<const std::vector<int64_t>>(data::byte_tokens("kjv.txt"));
//   const int64_t split = static_cast<int64_t>(tokens->size() * 0.9);
//   auto train = std::make_shared<data::NextTokenDataset>(tokens, 0, split, 128, 128);
//   auto val = std::make_shared<data::NextTokenDataset>(tokens, split, tokens->size(), 128, 128);
//   data::Batch b = train->get_batch({0, 1});   // b.input_ids (2,128), b.target_ids (2,128)
//   auto lm = std::make_shared<nn::Embedding>(256, 256);     // a (too) small language model
//   Tensor loss = cross_entropy(lm->forward(b.input_ids).reshape({-1, 256}),
//                               b.target_ids.reshape({-1}));
//
// Errors (InvalidArgument naming the value): an unreadable or empty file (its path); null
// tokens, context or stride < 1, a range outside the tokens, a token outside [0, vocab_size);
// an example index outside [0, size()).

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "framework/data/dataset.h"

namespace hsgd::data {

// The bytes of the file at path, each as a token in [0, 256).
std::vector<int64_t> byte_tokens(const std::filesystem::path& path);

class NextTokenDataset : public Dataset {
 public:
  // vocab_size bounds the tokens of [begin, end) (checked once, here); 256 for byte tokens.
  NextTokenDataset(std::shared_ptr<const std::vector<int64_t>> tokens, int64_t begin, int64_t end,
                   int64_t context, int64_t stride, int64_t vocab_size = 256);

  int64_t size() const override { return size_; }
  Shape example_shape() const override { return {context_}; }
  Batch get_batch(const std::vector<int64_t>& indices) const override;

  int64_t context() const { return context_; }
  int64_t vocab_size() const { return vocab_size_; }

 private:
  std::shared_ptr<const std::vector<int64_t>> tokens_;
  int64_t begin_;
  int64_t context_;
  int64_t stride_;
  int64_t vocab_size_;
  int64_t size_;
};

}  // namespace hsgd::data
