#include "framework/data/transforms.h"

#include "comm/error.h"
#include "framework/tensor/generator.h"

namespace hsgd::data {
namespace {

// splitmix64's finaliser: decorrelates nearby (seed, epoch, index) triples.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

RandomCropFlip::RandomCropFlip(RandomCropFlipOptions options) : options_(options) {
  HSGD_CHECK(options_.padding >= 0, "RandomCropFlip: padding ", options_.padding,
             " must not be negative");
  HSGD_CHECK(!options_.fill.empty(), "RandomCropFlip: fill must hold one value or one per channel");
}

RandomCropFlip::Draw RandomCropFlip::draw(int64_t index, int64_t epoch) const {
  Generator gen(mix(mix(options_.seed ^ 0x5eed) + static_cast<uint64_t>(epoch)) ^
                static_cast<uint64_t>(index));
  const int64_t pad = options_.padding;
  const auto range = static_cast<uint64_t>(2 * pad + 1);
  Draw out;
  out.dy = static_cast<int64_t>(gen.next_below(range)) - pad;
  out.dx = static_cast<int64_t>(gen.next_below(range)) - pad;
  out.flip = options_.horizontal_flip && gen.next_below(2) == 1;
  return out;
}

void RandomCropFlip::operator()(Batch& batch, const std::vector<int64_t>& indices,
                                int64_t epoch) const {
  const Tensor in = batch.inputs.defined() ? batch.inputs.contiguous() : batch.inputs;
  HSGD_CHECK(in.defined() && in.dim() == 4 && in.size(0) == static_cast<int64_t>(indices.size()),
             "RandomCropFlip: inputs must be (B,C,H,W) with B = ", indices.size(),
             " indices, got shape ", in.defined() ? shape_str(in.shape()) : std::string("none"));
  const int64_t b = in.size(0), c = in.size(1), h = in.size(2), w = in.size(3);
  const std::vector<float>& fill = options_.fill;
  HSGD_CHECK(fill.size() == 1 || static_cast<int64_t>(fill.size()) == c,
             "RandomCropFlip: ", fill.size(), " fill values for inputs of ", c,
             " channels (expected 1 or ", c, ")");
  const float* src_all = in.data();                            // (B,C,H,W)
  std::vector<float> out(static_cast<size_t>(b * c * h * w));  // (B,C,H,W)
  for (int64_t i = 0; i < b; ++i) {
    const Draw d = draw(indices[static_cast<size_t>(i)], epoch);
    for (int64_t ch = 0; ch < c; ++ch) {
      const float* src = src_all + (i * c + ch) * h * w;  // (H,W)
      float* dst = out.data() + (i * c + ch) * h * w;     // (H,W)
      const float pad_value = fill[fill.size() == 1 ? 0 : static_cast<size_t>(ch)];
      for (int64_t y = 0; y < h; ++y) {
        const int64_t sy = y + d.dy;
        for (int64_t x = 0; x < w; ++x) {
          // Output column x shows cropped column w-1-x when flipped.
          const int64_t sx = (d.flip ? w - 1 - x : x) + d.dx;
          const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
          dst[y * w + x] = inside ? src[sy * w + sx] : pad_value;
        }
      }
    }
  }
  batch.inputs = from_vector(std::move(out), {b, c, h, w});
}

}  // namespace hsgd::data
