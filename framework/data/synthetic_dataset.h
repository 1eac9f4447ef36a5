#pragma once
// SyntheticDataset: a seeded, learnable classification problem for tests and for running the
// examples without data files. Each class c has a centroid drawn from N(0, 1) per element; an
// example of class c is centroid_c + noise * N(0, 1). With the default noise the classes are
// separable by a linear model, so a few SGD steps must lower the loss.
// The same options give the same data on every machine and process (hsgd::Generator).
//
// Usage:
//   auto ds = std::make_shared<data::SyntheticDataset>(
//       data::SyntheticOptions{.size = 512, .example_shape = {20}, .num_classes = 4, .seed = 1});

#include <cstdint>

#include "framework/data/dataset.h"

namespace hsgd::data {

struct SyntheticOptions {
  int64_t size = 1024;
  Shape example_shape = {16};
  int64_t num_classes = 4;
  float noise = 0.5f;
  uint64_t seed = 0;
};

class SyntheticDataset : public InMemoryDataset {
 public:
  // Throws InvalidArgument for size < 0, num_classes < 1, an empty or non-positive shape, or
  // noise < 0.
  explicit SyntheticDataset(const SyntheticOptions& options);
  int64_t num_classes() const { return num_classes_; }

 private:
  int64_t num_classes_;
};

}  // namespace hsgd::data
