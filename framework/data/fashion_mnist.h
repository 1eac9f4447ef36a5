#pragma once
// FashionMNIST (and MNIST, same format): 28x28 grey images in 10 classes, read from the four IDX
// files of a directory (gzip or raw; Debian's dataset-fashion-mnist installs them in
// /usr/share/datasets/fashion-mnist):
//   train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz]   (60000 examples)
//   t10k-images-idx3-ubyte[.gz],  t10k-labels-idx1-ubyte[.gz]    (10000 examples)
// Inputs are (1,28,28) with pixels scaled to [0,1] (as torchvision's ToTensor), then, when
// normalize is set, (x - mean) / std.
//
// Errors: a missing directory or file, a corrupt file, or image and label files whose counts
// or sizes disagree throw InvalidArgument naming the path and what was expected.
//
// Usage:
//   data::FashionMNIST test(dir, data::FashionMNIST::Split::kTest, {.normalize = true});

#include <filesystem>

#include "framework/data/dataset.h"

namespace hsgd::data {

struct FashionMNISTOptions {
  bool normalize = false;
  // Mean and standard deviation of the Fashion-MNIST training pixels in [0,1].
  float mean = 0.2860f;
  float std = 0.3530f;
};

class FashionMNIST : public InMemoryDataset {
 public:
  enum class Split { kTrain, kTest };
  static constexpr int64_t kNumClasses = 10;

  FashionMNIST(const std::filesystem::path& dir, Split split, FashionMNISTOptions options = {});

 private:
  struct Loaded;
  static Loaded load(const std::filesystem::path& dir, Split split,
                     const FashionMNISTOptions& options);
  explicit FashionMNIST(Loaded&& loaded);
};

}  // namespace hsgd::data
