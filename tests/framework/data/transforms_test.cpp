#include "framework/data/transforms.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <vector>

#include "framework/data/data_loader.h"
#include "framework/data/subset.h"
#include "tests/support/error_message.h"

namespace hsgd::data {
namespace {

using testing::error_message;
using ::testing::HasSubstr;

constexpr int64_t kC = 2, kH = 5, kW = 6;

// n examples (2,5,6); value of example i, channel c, pixel (y,x) is i*1000 + c*100 + y*10 + x.
std::shared_ptr<InMemoryDataset> images(int64_t n) {
  std::vector<float> values;
  std::vector<int64_t> targets;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < kC; ++c)
      for (int64_t y = 0; y < kH; ++y)
        for (int64_t x = 0; x < kW; ++x)
          values.push_back(static_cast<float>(i * 1000 + c * 100 + y * 10 + x));
    targets.push_back(i % 10);
  }
  return std::make_shared<InMemoryDataset>(values, targets, Shape{kC, kH, kW});
}

// torchvision's order, written independently: pad with fill, crop HxW at (pad+dy, pad+dx), flip.
std::vector<float> reference(const std::vector<float>& image, int64_t pad,
                             const std::vector<float>& fills, const RandomCropFlip::Draw& d) {
  const int64_t ph = kH + 2 * pad, pw = kW + 2 * pad;
  std::vector<float> out;
  for (int64_t c = 0; c < kC; ++c) {
    const float fill = fills[fills.size() == 1 ? 0 : static_cast<size_t>(c)];
    std::vector<float> padded(static_cast<size_t>(ph * pw), fill);  // (H+2p, W+2p)
    for (int64_t y = 0; y < kH; ++y)
      for (int64_t x = 0; x < kW; ++x)
        padded[static_cast<size_t>((y + pad) * pw + x + pad)] =
            image[static_cast<size_t>((c * kH + y) * kW + x)];
    std::vector<float> crop;  // (H, W)
    for (int64_t y = 0; y < kH; ++y)
      for (int64_t x = 0; x < kW; ++x)
        crop.push_back(padded[static_cast<size_t>((y + pad + d.dy) * pw + x + pad + d.dx)]);
    for (int64_t y = 0; y < kH; ++y)
      for (int64_t x = 0; x < kW; ++x)
        out.push_back(crop[static_cast<size_t>(y * kW + (d.flip ? kW - 1 - x : x))]);
  }
  return out;
}

TEST(RandomCropFlipTest, MatchesPadCropFlipReference) {
  const auto data = images(40);
  const RandomCropFlip t({.padding = 2, .fill = {-7.5f, 3.25f}, .seed = 3});
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < 40; ++i) indices.push_back((i * 7) % 40);
  Batch batch = data->get_batch(indices);
  t(batch, indices, /*epoch=*/4);
  ASSERT_EQ(batch.inputs.shape(), (Shape{40, kC, kH, kW}));
  const std::vector<float> got = batch.inputs.to_vector();
  const int64_t per = kC * kH * kW;
  int flips = 0, shifted = 0;
  for (size_t i = 0; i < indices.size(); ++i) {
    const RandomCropFlip::Draw d = t.draw(indices[i], 4);
    EXPECT_LE(std::abs(d.dy), 2);
    EXPECT_LE(std::abs(d.dx), 2);
    flips += d.flip;
    shifted += d.dy != 0 || d.dx != 0;
    const Batch one = data->get_batch({indices[i]});
    const std::vector<float> want = reference(one.inputs.to_vector(), 2, {-7.5f, 3.25f}, d);
    for (int64_t k = 0; k < per; ++k) {
      ASSERT_EQ(got[i * per + static_cast<size_t>(k)], want[static_cast<size_t>(k)])
          << "example " << indices[i] << " element " << k << " dy " << d.dy << " dx " << d.dx
          << " flip " << d.flip;
    }
  }
  // 40 fair coins and 25 offsets each: all-equal outcomes would mean the draws are broken.
  EXPECT_GT(flips, 5);
  EXPECT_LT(flips, 35);
  EXPECT_GT(shifted, 25);
}

TEST(RandomCropFlipTest, DrawDependsOnlyOnSeedEpochAndIndex) {
  const auto data = images(8);
  const RandomCropFlip t({.padding = 2, .seed = 1});
  // Example 5 alone and inside another batch: the same pixels.
  Batch alone = data->get_batch({5});
  t(alone, {5}, 2);
  Batch mixed = data->get_batch({3, 5, 1});
  t(mixed, {3, 5, 1}, 2);
  EXPECT_EQ(alone.inputs.to_vector(), mixed.inputs.narrow(0, 1, 1).to_vector());
  // Another epoch or seed gives other draws for most of 200 indices.
  const RandomCropFlip other_seed({.padding = 2, .seed = 2});
  int differ_epoch = 0, differ_seed = 0;
  for (int64_t i = 0; i < 200; ++i) {
    const auto a = t.draw(i, 0), b = t.draw(i, 1), c = other_seed.draw(i, 0);
    differ_epoch += a.dy != b.dy || a.dx != b.dx || a.flip != b.flip;
    differ_seed += a.dy != c.dy || a.dx != c.dx || a.flip != c.flip;
  }
  EXPECT_GT(differ_epoch, 150);
  EXPECT_GT(differ_seed, 150);
  // Every offset in [-2, 2] occurs.
  std::set<int64_t> dys;
  for (int64_t i = 0; i < 200; ++i) dys.insert(t.draw(i, 0).dy);
  EXPECT_EQ(dys, (std::set<int64_t>{-2, -1, 0, 1, 2}));
}

TEST(RandomCropFlipTest, ZeroPaddingWithoutFlipIsIdentity) {
  const auto data = images(3);
  Batch batch = data->get_batch({0, 1, 2});
  const std::vector<float> before = batch.inputs.to_vector();
  RandomCropFlip({.padding = 0, .horizontal_flip = false})(batch, {0, 1, 2}, 0);
  EXPECT_EQ(batch.inputs.to_vector(), before);
}

TEST(RandomCropFlipTest, Errors) {
  EXPECT_THAT(error_message([] { RandomCropFlip({.padding = -1}); }), HasSubstr("padding -1"));
  const auto data = images(2);
  Batch batch = data->get_batch({0, 1});
  const RandomCropFlip t({});
  EXPECT_THAT(error_message([&] { t(batch, {0}, 0); }), HasSubstr("B = 1"));
  EXPECT_THAT(error_message([&] { RandomCropFlip({.fill = {}}); }), HasSubstr("fill"));
  const RandomCropFlip three({.fill = {1, 2, 3}});
  EXPECT_THAT(error_message([&] {
                three(batch, {0, 1}, 0);
              }),
              HasSubstr("3 fill values for inputs of 2 channels"));
}

TEST(RandomCropFlipTest, DataLoaderPassesIndicesAndEpoch) {
  const auto data = images(10);
  std::vector<std::pair<int64_t, int64_t>> calls;  // (first index, epoch)
  DataLoader loader(
      data, {.batch_size = 4,
             .shuffle = true,
             .seed = 9,
             .transform = [&](Batch& b, const std::vector<int64_t>& indices, int64_t epoch) {
               EXPECT_EQ(b.inputs.size(0), static_cast<int64_t>(indices.size()));
               calls.emplace_back(indices.front(), epoch);
             }});
  loader.set_epoch(3);
  for (const Batch& b : loader) (void)b;
  ASSERT_EQ(calls.size(), 3u);
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].first, loader.indices()[i * 4]) << "batch " << i;
    EXPECT_EQ(calls[i].second, 3) << "batch " << i;
  }
}

TEST(SubsetTest, MapsIndicesToTheParent) {
  const auto data = images(10);
  const Subset subset(data, {7, 2, 9});
  EXPECT_EQ(subset.size(), 3);
  EXPECT_EQ(subset.example_shape(), (Shape{kC, kH, kW}));
  const Batch b = subset.get_batch({2, 0});
  EXPECT_EQ(b.targets, (std::vector<int64_t>{9, 7}));
  EXPECT_EQ(b.inputs.to_vector(), data->get_batch({9, 7}).inputs.to_vector());
  const auto first = first_n(data, 4);
  EXPECT_EQ(first->size(), 4);
  EXPECT_EQ(first->get_batch({3}).targets, (std::vector<int64_t>{3}));
}

TEST(SubsetTest, Errors) {
  const auto data = images(10);
  EXPECT_THAT(error_message([&] {
                Subset(data, {3, 10});
              }),
              HasSubstr("index 10 at position 1 is outside the parent's [0, 10)"));
  EXPECT_THAT(error_message([&] { first_n(data, 11); }),
              HasSubstr("11 examples requested, the data set has 10"));
  const Subset subset(data, {1});
  EXPECT_THAT(error_message([&] { subset.get_batch({1}); }), HasSubstr("index 1 out of range"));
}

}  // namespace
}  // namespace hsgd::data
