#pragma once
// Data sets: a Dataset maps an index in [0, size()) to one example (an input tensor of
// example_shape() and an int64 class target). DataLoader (data_loader.h) draws batches from it.
//
// InMemoryDataset keeps all examples in one float buffer, (size, example_shape...) row-major,
// and is the base of FashionMNIST and SyntheticDataset; a batch is a gather of rows.
//
// Usage:
//   auto train = std::make_shared<data::FashionMNIST>("/usr/share/datasets/fashion-mnist",
//                                                     data::FashionMNIST::Split::kTrain);
//   data::Batch b = train->get_batch({0, 5, 9});    // inputs (3,1,28,28), targets {..3..}

#include <cstdint>
#include <vector>

#include "framework/tensor/index_tensor.h"
#include "framework/tensor/tensor.h"

namespace hsgd::data {

// A batch of B examples: float inputs (B, example_shape...) with B class targets, or, from a data
// set of token sequences (text.h), input ids (B, T) with target ids (B, T).
struct Batch {
  Tensor inputs;
  std::vector<int64_t> targets;
  IndexTensor input_ids;   // (B, T) token ids; undefined for float inputs
  IndexTensor target_ids;  // (B, T) next-token targets; undefined for class targets

  // B: the number of examples.
  int64_t size() const;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Shape of one input, without the batch dimension.
  virtual Shape example_shape() const = 0;
  // Stacks the examples at indices (each in [0, size()), InvalidArgument otherwise).
  virtual Batch get_batch(const std::vector<int64_t>& indices) const = 0;
};

// Examples held in memory: values is (size, example_shape...) row-major, one target per example.
class InMemoryDataset : public Dataset {
 public:
  // Throws InvalidArgument when values.size() != targets.size() * numel(example_shape).
  InMemoryDataset(std::vector<float> values, std::vector<int64_t> targets, Shape example_shape);

  int64_t size() const override { return static_cast<int64_t>(targets_.size()); }
  Shape example_shape() const override { return example_shape_; }
  Batch get_batch(const std::vector<int64_t>& indices) const override;

  const std::vector<float>& values() const { return values_; }
  const std::vector<int64_t>& targets() const { return targets_; }

 private:
  std::vector<float> values_;
  std::vector<int64_t> targets_;
  Shape example_shape_;
  int64_t example_numel_;
};

}  // namespace hsgd::data
