#pragma once
// CIFAR10: the CIFAR-10 data set read from its binary version (cifar-10-binary.tar.gz):
//   train: data_batch_1.bin .. data_batch_5.bin (10000 records each)   test: test_batch.bin
// in `dir` or in `dir`/cifar-10-batches-bin. A record is 3073 bytes: the label (0..9), then the
// 32x32 red, green and blue planes, row-major. Inputs are (3,32,32): pixels scaled to [0,1] (as
// torchvision's ToTensor), then, when normalize is set, (x - mean[c]) / std[c] per channel.
//
// Pixels are kept as bytes (150 MB for the training set instead of 600 MB of floats) and
// converted when a batch is gathered.
//
// Augmentation (training): with augment set, every example of a batch is first randomly cropped
// back to 32x32 from the image padded by crop_padding pixels of black on each side, then flipped
// left-right with probability 1/2 -- torchvision's RandomCrop(32, padding=4) followed by
// RandomHorizontalFlip(), applied before normalisation, so the padding takes the normalised value
// of a black pixel. The draws come from a Generator(seed) owned by the data set, consumed in
// get_batch call order: the same seed and the same sequence of get_batch calls give the same
// batches on every machine. get_batch may be called from several threads (the draws are
// serialised), but the batches then depend on the thread interleaving. This stream is in no
// checkpoint (with DataLoader prefetch it runs ahead of training, so no saved position would
// be the trained one): a resumed run draws other crops and flips. For augmentation that resumes
// exactly, leave augment off and give the DataLoader data::RandomCropFlip (transforms.h), whose
// draws depend on (seed, epoch, index) alone, as train_resnet does.
//
// Usage:
//   data::CIFAR10 train(dir, data::CIFAR10::Split::kTrain, {.augment = true, .seed = 1});
//   data::Batch b = train.get_batch({0, 1});        // inputs (2,3,32,32), targets {6, 9}
//
// Errors (InvalidArgument naming the path and what was expected): a missing directory or file, a
// file whose size is not records_per_file * 3073 bytes (truncated or not CIFAR-10), a label
// outside [0,10), non-positive std, records_per_file < 1, crop_padding < 0.

#include <array>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "framework/data/dataset.h"
#include "framework/tensor/generator.h"

namespace hsgd::data {

struct CIFAR10Options {
  bool normalize = true;
  // Per-channel mean and standard deviation of the CIFAR-10 training pixels in [0,1].
  std::array<float, 3> mean = {0.4914f, 0.4822f, 0.4465f};
  std::array<float, 3> std = {0.2470f, 0.2435f, 0.2616f};
  bool augment = false;      // random crop + horizontal flip, for the training split
  int64_t crop_padding = 4;  // pixels of black added on each side before cropping
  bool horizontal_flip = true;
  uint64_t seed = 0;  // of the augmentation draws
  // Records in each file: 10000 in the real data set; tests write smaller files.
  int64_t records_per_file = 10000;
};

class CIFAR10 : public Dataset {
 public:
  enum class Split { kTrain, kTest };
  static constexpr int64_t kNumClasses = 10;
  static constexpr int64_t kChannels = 3;
  static constexpr int64_t kImageSize = 32;
  static constexpr int64_t kImageBytes = kChannels * kImageSize * kImageSize;  // 3072
  static constexpr int64_t kRecordBytes = 1 + kImageBytes;                     // 3073

  CIFAR10(const std::filesystem::path& dir, Split split, CIFAR10Options options = {});

  // The file names of a split, in reading order.
  static std::vector<std::string> file_names(Split split);

  int64_t size() const override { return static_cast<int64_t>(targets_.size()); }
  Shape example_shape() const override { return {kChannels, kImageSize, kImageSize}; }
  // inputs (B,3,32,32), normalised and (with augment) cropped and flipped.
  Batch get_batch(const std::vector<int64_t>& indices) const override;

  const std::vector<int64_t>& targets() const { return targets_; }
  const CIFAR10Options& options() const { return options_; }

 private:
  void read_file(const std::filesystem::path& path);

  // Constant after construction.
  CIFAR10Options options_;
  std::vector<uint8_t> pixels_;  // (size, 3, 32, 32)
  std::vector<int64_t> targets_;
  std::array<float, 3> scale_{}, shift_{};  // value = pixel * scale[c] - shift[c]

  mutable std::mutex mu_;
  mutable Generator gen_;  // guarded by mu_: augmentation draws
};

}  // namespace hsgd::data
