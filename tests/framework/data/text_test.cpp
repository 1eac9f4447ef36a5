// Byte tokens and NextTokenDataset: the windows and their next-token targets, the number of
// examples, sharding and resuming through DataLoader, and the errors for bad input.

#include "framework/data/text.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/data/data_loader.h"
#include "tests/support/error_message.h"

namespace hsgd::data {
namespace {

using ::testing::ElementsAre;
using testing::error_message;
using ::testing::HasSubstr;

// Tokens 100, 101, ..., 100 + n - 1.
std::shared_ptr<const std::vector<int64_t>> counting(int64_t n) {
  auto tokens = std::make_shared<std::vector<int64_t>>();
  for (int64_t i = 0; i < n; ++i) tokens->push_back(100 + i);
  return tokens;
}

TEST(TextTest, ByteTokens_AreTheFilesBytes) {
  const auto path = std::filesystem::temp_directory_path() / "hsgd_text_test.txt";
  {
    std::ofstream out(path, std::ios::binary);
    out << "Ab\n" << static_cast<char>(0xE9);
  }
  EXPECT_THAT(byte_tokens(path), ElementsAre(65, 98, 10, 233));
  std::filesystem::remove(path);
  EXPECT_THAT(error_message<InvalidArgument>([&] { byte_tokens(path); }),
              HasSubstr("cannot read '" + path.string() + "'"));
}

TEST(TextTest, Windows_TargetsAreTheInputsOneTokenLater) {
  NextTokenDataset ds(counting(20), 2, 14, 4, 4, 1000);
  // Tokens 102..113: windows start at 102, 106 (110 + 4 targets would need token 114).
  ASSERT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.example_shape(), (Shape{4}));
  const Batch b = ds.get_batch({1, 0});
  EXPECT_EQ(b.size(), 2);
  EXPECT_EQ(b.input_ids.shape(), (Shape{2, 4}));
  EXPECT_THAT(b.input_ids.to_vector(), ElementsAre(106, 107, 108, 109, 102, 103, 104, 105));
  EXPECT_THAT(b.target_ids.to_vector(), ElementsAre(107, 108, 109, 110, 103, 104, 105, 106));
  EXPECT_FALSE(b.inputs.defined());
  EXPECT_TRUE(b.targets.empty());
}

TEST(TextTest, Size_CountsEveryWindowWhoseTargetsFit) {
  EXPECT_EQ(NextTokenDataset(counting(9), 0, 9, 4, 4, 1000).size(), 2);  // targets end at 9
  EXPECT_EQ(NextTokenDataset(counting(8), 0, 8, 4, 4, 1000).size(), 1);
  EXPECT_EQ(NextTokenDataset(counting(9), 0, 9, 4, 1, 1000).size(), 5);  // overlapping
  EXPECT_EQ(NextTokenDataset(counting(4), 0, 4, 4, 4, 1000).size(), 0);
}

TEST(TextTest, DataLoader_ShardsAndResumesWindows) {
  auto ds = std::make_shared<NextTokenDataset>(counting(401), 0, 401, 4, 4, 1000);
  ASSERT_EQ(ds->size(), 100);
  std::set<int64_t> firsts;
  for (int rank = 0; rank < 2; ++rank) {
    DataLoader loader(ds,
                      {.batch_size = 5, .shuffle = true, .seed = 3, .rank = rank, .world_size = 2});
    for (const Batch& b : loader) {
      for (int64_t i = 0; i < b.size(); ++i) firsts.insert(b.input_ids[i * 4]);
    }
  }
  EXPECT_EQ(firsts.size(), 100u);  // the two shards together hold every window once

  DataLoader loader(ds, {.batch_size = 5, .shuffle = true, .seed = 3});
  loader.set_epoch(1);
  auto it = loader.begin();
  ++it;
  const StateDict state = loader.state_dict();  // batches 0 and 1 handed out (and trained)
  ++it;
  const std::vector<int64_t> next = it->input_ids.to_vector();
  DataLoader resumed(ds, {.batch_size = 5, .shuffle = true, .seed = 3});
  resumed.load_state_dict(state);
  resumed.set_epoch(1);
  EXPECT_EQ(resumed.begin()->input_ids.to_vector(), next);
}

TEST(TextTest, BadInput_IsNamed) {
  EXPECT_THAT(error_message<InvalidArgument>([] { NextTokenDataset(counting(200), 0, 200, 4, 4); }),
              HasSubstr("token 156 is 256, expected a value in [0, 256)"));
  EXPECT_THAT(
      error_message<InvalidArgument>([] { NextTokenDataset(counting(10), 5, 11, 4, 4, 1000); }),
      HasSubstr("range [5, 11) is outside the 10 tokens"));
  EXPECT_THAT(
      error_message<InvalidArgument>([] { NextTokenDataset(counting(10), 0, 10, 0, 4, 1000); }),
      HasSubstr("context 0 and stride 4 must be at least 1"));
  NextTokenDataset ds(counting(10), 0, 10, 4, 4, 1000);
  EXPECT_THAT(error_message<InvalidArgument>([&] {
                ds.get_batch({0, 2});
              }),
              HasSubstr("example index 2 (batch position 1) is outside [0, 2)"));
}

}  // namespace
}  // namespace hsgd::data
