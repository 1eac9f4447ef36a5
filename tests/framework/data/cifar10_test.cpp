#include "framework/data/cifar10.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "comm/error.h"
#include "tests/support/multiprocess.h"

namespace hsgd::data {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kRecords = 3;  // per file in these tests (10000 in the real data set)

// Pixel (c, y, x) of record r of file f: any byte pattern that differs between records,
// channels and positions, so that a wrong offset or plane shows up.
uint8_t pixel(int f, int64_t r, int64_t c, int64_t y, int64_t x) {
  return static_cast<uint8_t>((f * 53 + r * 31 + c * 71 + y * 7 + x * 3) % 256);
}
int64_t label(int f, int64_t r) { return (f * 3 + r) % 10; }

void write_file(const fs::path& path, int f, int64_t records, int64_t truncate_by = 0,
                int bad_label_record = -1) {
  std::string bytes;
  for (int64_t r = 0; r < records; ++r) {
    bytes.push_back(static_cast<char>(r == bad_label_record ? 10 : label(f, r)));
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t y = 0; y < 32; ++y) {
        for (int64_t x = 0; x < 32; ++x) bytes.push_back(static_cast<char>(pixel(f, r, c, y, x)));
      }
    }
  }
  bytes.resize(bytes.size() - static_cast<size_t>(truncate_by));
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// data_batch_1..5.bin are files 1..5, test_batch.bin is file 0.
fs::path write_dataset(const std::string& tag) {
  const fs::path dir = testing::unique_temp_dir(tag);
  write_file(dir / "test_batch.bin", 0, kRecords);
  for (int f = 1; f <= 5; ++f) {
    write_file(dir / ("data_batch_" + std::to_string(f) + ".bin"), f, kRecords);
  }
  return dir;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "<no InvalidArgument thrown>";
}

const CIFAR10Options kSmall{.records_per_file = kRecords};

TEST(CIFAR10Test, ReadsLabelsAndNormalisedPixels_BothSplits) {
  const fs::path dir = write_dataset("cifar_good");
  const CIFAR10 train(dir, CIFAR10::Split::kTrain, kSmall);
  const CIFAR10 test(dir, CIFAR10::Split::kTest, kSmall);
  ASSERT_EQ(train.size(), 5 * kRecords);
  ASSERT_EQ(test.size(), kRecords);
  EXPECT_EQ(shape_str(train.example_shape()), "[3, 32, 32]");

  const std::vector<int64_t> indices = {7, 0,
                                        14};  // file 3 record 1, file 1 record 0, file 5 record 2
  const Batch b = train.get_batch(indices);
  ASSERT_EQ(shape_str(b.inputs.shape()), "[3, 3, 32, 32]");
  const std::vector<float> v = b.inputs.to_vector();
  for (size_t i = 0; i < indices.size(); ++i) {
    const int f = static_cast<int>(indices[i] / kRecords) + 1;
    const int64_t r = indices[i] % kRecords;
    EXPECT_EQ(b.targets[i], label(f, r)) << "example " << i;
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t y = 0; y < 32; y += 5) {
        for (int64_t x = 0; x < 32; x += 3) {
          const double expected = (pixel(f, r, c, y, x) / 255.0 - kSmall.mean[c]) / kSmall.std[c];
          const float actual = v[static_cast<size_t>(((i * 3 + c) * 32 + y) * 32 + x)];
          ASSERT_NEAR(actual, expected, 1e-5)
              << "example " << i << " channel " << c << " y " << y << " x " << x;
        }
      }
    }
  }
  EXPECT_EQ(test.get_batch({2}).targets[0], label(0, 2));
}

TEST(CIFAR10Test, WithoutNormalize_PixelsAreScaledToUnitRange) {
  const fs::path dir = write_dataset("cifar_raw");
  const CIFAR10 test(dir, CIFAR10::Split::kTest,
                     {.normalize = false, .records_per_file = kRecords});
  const std::vector<float> v = test.get_batch({1}).inputs.to_vector();
  EXPECT_FLOAT_EQ(v[2 * 1024 + 5 * 32 + 9], pixel(0, 1, 2, 5, 9) / 255.0f);
}

TEST(CIFAR10Test, ArchiveSubdirectory_IsFound) {
  const fs::path root = testing::unique_temp_dir("cifar_nested");
  fs::create_directory(root / "cifar-10-batches-bin");
  write_file(root / "cifar-10-batches-bin" / "test_batch.bin", 0, kRecords);
  EXPECT_EQ(CIFAR10(root, CIFAR10::Split::kTest, kSmall).size(), kRecords);
}

TEST(CIFAR10Test, TruncatedFile_NamesFileAndExpectedSize) {
  const fs::path dir = write_dataset("cifar_truncated");
  write_file(dir / "data_batch_4.bin", 4, kRecords, /*truncate_by=*/100);
  const std::string msg = error_of([&] { CIFAR10(dir, CIFAR10::Split::kTrain, kSmall); });
  EXPECT_NE(msg.find((dir / "data_batch_4.bin").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(kRecords * 3073)), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(kRecords * 3073 - 100)), std::string::npos) << msg;
}

TEST(CIFAR10Test, RealSizeExpectedByDefault_SmallFileIsRejected) {
  const fs::path dir = write_dataset("cifar_default_size");
  const std::string msg = error_of([&] { CIFAR10(dir, CIFAR10::Split::kTest); });
  EXPECT_NE(msg.find("30730000"), std::string::npos) << msg;
}

TEST(CIFAR10Test, MissingFileOrDirectory_IsNamed) {
  const fs::path dir = write_dataset("cifar_missing");
  fs::remove(dir / "data_batch_2.bin");
  std::string msg = error_of([&] { CIFAR10(dir, CIFAR10::Split::kTrain, kSmall); });
  EXPECT_NE(msg.find((dir / "data_batch_2.bin").string()), std::string::npos) << msg;
  msg = error_of([&] { CIFAR10(dir / "nope", CIFAR10::Split::kTest, kSmall); });
  EXPECT_NE(msg.find((dir / "nope").string()), std::string::npos) << msg;
}

TEST(CIFAR10Test, BadLabelOrIndexOrOptions_AreRejected) {
  const fs::path dir = write_dataset("cifar_bad_label");
  write_file(dir / "test_batch.bin", 0, kRecords, 0, /*bad_label_record=*/1);
  const std::string msg = error_of([&] { CIFAR10(dir, CIFAR10::Split::kTest, kSmall); });
  EXPECT_NE(msg.find("label 10 of record 1"), std::string::npos) << msg;

  const fs::path good = write_dataset("cifar_bad_index");
  const CIFAR10 test(good, CIFAR10::Split::kTest, kSmall);
  EXPECT_THROW(test.get_batch({kRecords}), InvalidArgument);
  EXPECT_THROW(test.get_batch({-1}), InvalidArgument);
  EXPECT_THROW(CIFAR10(good, CIFAR10::Split::kTest, {.records_per_file = 0}), InvalidArgument);
  EXPECT_THROW(
      CIFAR10(good, CIFAR10::Split::kTest, {.crop_padding = -1, .records_per_file = kRecords}),
      InvalidArgument);
}

// Every augmented image must be the original shifted by (dy, dx) in [-4, 4]^2, optionally flipped
// left-right, with black (normalised) where the shift uncovers padding.
bool is_crop_flip_of(const std::vector<float>& aug, const std::vector<float>& orig,
                     const CIFAR10Options& o, int64_t* shifts_seen_mask) {
  for (int flip = 0; flip < 2; ++flip) {
    for (int64_t dy = -4; dy <= 4; ++dy) {
      for (int64_t dx = -4; dx <= 4; ++dx) {
        bool match = true;
        for (int64_t c = 0; c < 3 && match; ++c) {
          const float black = -o.mean[c] / o.std[c];
          for (int64_t y = 0; y < 32 && match; ++y) {
            for (int64_t x = 0; x < 32 && match; ++x) {
              const int64_t sy = y + dy, sx = (flip ? 31 - x : x) + dx;
              const bool inside = sy >= 0 && sy < 32 && sx >= 0 && sx < 32;
              const float expected =
                  inside ? orig[static_cast<size_t>((c * 32 + sy) * 32 + sx)] : black;
              match = std::fabs(aug[static_cast<size_t>((c * 32 + y) * 32 + x)] - expected) < 1e-6;
            }
          }
        }
        if (match) {
          *shifts_seen_mask |= int64_t{1} << flip;
          return true;
        }
      }
    }
  }
  return false;
}

TEST(CIFAR10Test, Augmentation_IsCropOfPaddedImagePlusFlip_AndSeeded) {
  const fs::path dir = write_dataset("cifar_augment");
  const CIFAR10 plain(dir, CIFAR10::Split::kTrain, kSmall);
  CIFAR10Options aug_options = kSmall;
  aug_options.augment = true;
  aug_options.seed = 9;
  const CIFAR10 aug(dir, CIFAR10::Split::kTrain, aug_options);
  const CIFAR10 same_seed(dir, CIFAR10::Split::kTrain, aug_options);
  aug_options.seed = 10;
  const CIFAR10 other_seed(dir, CIFAR10::Split::kTrain, aug_options);

  std::vector<int64_t> all;
  for (int64_t i = 0; i < plain.size(); ++i) all.push_back(i);
  int64_t flips_seen = 0;
  bool any_changed = false;
  for (int pass = 0; pass < 4; ++pass) {
    const Batch a = aug.get_batch(all);
    const Batch o = plain.get_batch(all);
    EXPECT_EQ(a.targets, o.targets);
    EXPECT_EQ(a.inputs.to_vector(), same_seed.get_batch(all).inputs.to_vector()) << "pass " << pass;
    EXPECT_NE(a.inputs.to_vector(), other_seed.get_batch(all).inputs.to_vector())
        << "pass " << pass;
    for (int64_t i = 0; i < plain.size(); ++i) {
      const std::vector<float> ai = a.inputs.narrow(0, i, 1).to_vector();
      const std::vector<float> oi = o.inputs.narrow(0, i, 1).to_vector();
      any_changed |= ai != oi;
      ASSERT_TRUE(is_crop_flip_of(ai, oi, aug_options, &flips_seen))
          << "pass " << pass << " example " << i << " is not a shifted/flipped copy";
    }
  }
  EXPECT_TRUE(any_changed);
  EXPECT_EQ(flips_seen, 3) << "60 draws should include both flipped and unflipped images";
}

}  // namespace
}  // namespace hsgd::data
