#pragma once
// Batch transforms applied by DataLoader (DataLoaderOptions::transform) after Dataset::get_batch.
// A transform sees the batch, the data set indices of its examples and the loader's epoch, so a
// random augmentation can draw from (seed, epoch, index) alone: the same example in the same
// epoch is transformed the same way on every rank, in every batch order and after a resume from
// a checkpoint (nothing to save), unlike a generator consumed in call order.
//
// Usage:
//   data::DataLoader loader(dataset, {.batch_size = 128, .shuffle = true, .seed = 1,
//                                     .transform = data::RandomCropFlip({.padding = 2,
//                                                                        .fill = {-1.0f}})});
//
// RandomCropFlip: torchvision's RandomCrop(size=(H,W), padding) followed by
// RandomHorizontalFlip(), on inputs (B,C,H,W): every example is padded by `padding` pixels of
// value `fill` on each side, cropped back to HxW at an offset (dy, dx) uniform in
// [-padding, padding]^2, then flipped left-right with probability 1/2. The draws of example
// `index` in epoch `epoch` come from Generator(mix(seed, epoch, index)). Apply it to normalised
// inputs with fill = the normalised value of the padding colour (e.g. -mean/std for black), one
// value or one per channel.
//
// Errors (InvalidArgument naming the value): padding < 0 or an empty fill at construction;
// inputs that are not (B,C,H,W) with B equal to the number of indices, or C channels when fill
// has more than one value and not C.

#include <cstdint>
#include <functional>
#include <vector>

#include "framework/data/dataset.h"

namespace hsgd::data {

// transform(batch, indices, epoch): may change batch.inputs (and targets) in place.
using BatchTransform =
    std::function<void(Batch& batch, const std::vector<int64_t>& indices, int64_t epoch)>;

struct RandomCropFlipOptions {
  int64_t padding = 4;
  bool horizontal_flip = true;
  // Value of the padding pixels (already normalised): one for every channel, or one per channel.
  std::vector<float> fill = {0.0f};
  uint64_t seed = 0;
};

class RandomCropFlip {
 public:
  explicit RandomCropFlip(RandomCropFlipOptions options);

  void operator()(Batch& batch, const std::vector<int64_t>& indices, int64_t epoch) const;

  // The crop offsets and flip of one example (for tests): dy, dx in [-padding, padding].
  struct Draw {
    int64_t dy = 0, dx = 0;
    bool flip = false;
  };
  Draw draw(int64_t index, int64_t epoch) const;

  const RandomCropFlipOptions& options() const { return options_; }

 private:
  RandomCropFlipOptions options_;
};

}  // namespace hsgd::data
