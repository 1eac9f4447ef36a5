// apps/common/level_options.h and apps::parse_hierarchy: --hierarchy read by the framework's
// grammar (hierarchy_text_test.cpp tests it in full), its errors as BadFlag naming the flag, and
// the top-level flags.

#include "apps/common/level_options.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "apps/common/parallel_training.h"

namespace hsgd::apps {
namespace {

using distributed::Compression;
using distributed::LevelOptions;

std::vector<LevelOptions> levels_of(const std::string& hierarchy, const LevelFlags& flags = {}) {
  return make_level_options(parse_hierarchy(hierarchy), hierarchy, flags);
}

TEST(LevelOptionsFlags, NodeAndWorldGroupSizes) {
  EXPECT_EQ(parse_hierarchy("2:node,8:world"),
            (std::vector<std::pair<int64_t, int>>{{2, distributed::kNodeGroup},
                                                  {8, distributed::kWholeGroup}}));
  const auto levels = levels_of("1:2,4:node@bf16,16:world");
  ASSERT_EQ(levels.size(), 3u);
  EXPECT_EQ(distributed::describe(levels[1]), "4:node@bf16");
  EXPECT_EQ(distributed::describe(levels[2]), "16:world");
  try {
    parse_hierarchy("2:nodes,8:world");
    ADD_FAILURE() << "'nodes' was accepted";
  } catch (const BadFlag& e) {
    EXPECT_NE(std::string(e.what()).find("group size 'nodes' is not a positive integer (or 0 / "
                                         "'world': the whole group, or 'node': each node's "
                                         "ranks)"),
              std::string::npos)
        << e.what();
  }
}

// A number that is one but too large says so (it is not "not a positive integer").
TEST(LevelOptionsFlags, TooLargeNumbersAreNamedAsTooLarge) {
  for (const std::string text : {"2:99999999999", "99999999999999999999:4", "2:1073741825"}) {
    try {
      parse_hierarchy(text);
      ADD_FAILURE() << text << " was accepted";
    } catch (const BadFlag& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("is too large (at most 1073741824)"), std::string::npos) << message;
      EXPECT_EQ(message.find("not a positive integer"), std::string::npos) << message;
    }
  }
  EXPECT_EQ(parse_hierarchy("2:1073741824").back().second, 1073741824);
}

TEST(LevelOptionsFlags, PerLevelSyntax_ParsesEveryOption) {
  const auto levels = levels_of("1:2,16:4@outer=0.7/0.9/nesterov,overlap=2,bf16,ef");
  ASSERT_EQ(levels.size(), 2u);
  EXPECT_TRUE(distributed::is_plain(levels[0]));
  EXPECT_EQ(levels[0].period, 1);
  EXPECT_EQ(levels[0].group_size, 2);
  const LevelOptions& top = levels[1];
  EXPECT_EQ(top.period, 16);
  EXPECT_EQ(top.group_size, 4);
  ASSERT_TRUE(top.outer.has_value());
  EXPECT_EQ(top.outer->lr, 0.7);
  EXPECT_EQ(top.outer->momentum, 0.9);
  EXPECT_TRUE(top.outer->nesterov);
  EXPECT_EQ(top.overlap_steps, 2);
  EXPECT_EQ(top.compression, Compression::kBF16);
  EXPECT_TRUE(top.error_feedback);
  EXPECT_EQ(distributed::describe(top), "16:4@outer=0.7/0.9/nesterov,overlap=2,bf16,ef");
}

TEST(LevelOptionsFlags, OptionsOnALowerLevelAndFp16Scale) {
  const auto levels = levels_of("2:2@outer=0.5,fp16=1024,4:4");
  ASSERT_EQ(levels.size(), 2u);
  ASSERT_TRUE(levels[0].outer.has_value());
  EXPECT_EQ(levels[0].outer->lr, 0.5);
  EXPECT_EQ(levels[0].outer->momentum, 0.0);
  EXPECT_FALSE(levels[0].outer->nesterov);
  EXPECT_EQ(levels[0].compression, Compression::kFP16);
  EXPECT_EQ(levels[0].compression_scale, 1024.0f);
  EXPECT_TRUE(distributed::is_plain(levels[1]));
  EXPECT_EQ(parse_hierarchy("2:2@outer=0.5,fp16=1024,4:4"),
            (std::vector<std::pair<int64_t, int>>{{2, 2}, {4, 4}}));
}

TEST(LevelOptionsFlags, TopLevelFlags_ApplyToTheLastLevel) {
  LevelFlags flags{.outer_lr = 0.7,
                   .outer_momentum = 0.9,
                   .outer_nesterov = true,
                   .overlap_steps = 1,
                   .compression = "bf16"};
  const auto levels = levels_of("2:2,8:4", flags);
  EXPECT_TRUE(distributed::is_plain(levels[0]));
  EXPECT_EQ(distributed::describe(levels[1]), "8:4@outer=0.7/0.9/nesterov,overlap=1,bf16");
  // local-sgd: the only level.
  const auto single = make_level_options({{4, 0}}, "", LevelFlags{.overlap_steps = 3});
  EXPECT_EQ(single[0].overlap_steps, 3);
  EXPECT_FALSE(single[0].outer.has_value());
}

void expect_bad(const std::function<void()>& f, const std::string& expected) {
  try {
    f();
    ADD_FAILURE() << "no BadFlag, expected one containing '" << expected << "'";
  } catch (const BadFlag& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

TEST(LevelOptionsFlags, BadItems_NameTheFlagAndItem) {
  expect_bad([] { levels_of("2:2,4:4@zip"); },
             "--hierarchy '2:2,4:4@zip': level 1: unknown level option 'zip'");
  expect_bad([] { parse_hierarchy("2:2,four:4"); },
             "--hierarchy '2:2,four:4': period 'four' is not a positive integer; expected "
             "period:group_size pairs");
  expect_bad([] { levels_of("2:2,4:4@outer=fast"); }, "outer lr 'fast' is not a number");
  expect_bad([] { levels_of("2:2,4:4@outer=1/0.9/heavy"); },
             "expected outer=LR[/MOMENTUM[/nesterov]]");
  expect_bad([] { levels_of("2:2,4:4@overlap=1.5"); }, "overlap '1.5' is not an integer");
  expect_bad(
      [] {
        make_level_options({{2, 2}, {4, 4}}, "2:2,bf16,4:4", {});
      },
      "--hierarchy '2:2,bf16,4:4': option 'bf16' must follow '@' on a level, e.g. 2:2@bf16");
  expect_bad(
      [] {
        make_level_options({{2, 2}}, "2:2,4:4", {});
      },
      "--hierarchy '2:2,4:4' has 2 levels, but 1 period:group_size pairs were given for it");
  expect_bad([] { levels_of("2:2,4:4@bf16", LevelFlags{.outer_lr = 0.5}); },
             "give them in one place");
  // An outer momentum without an outer lr names the flag missing, not an "outer lr 0".
  expect_bad([] { levels_of("2:2,4:4", LevelFlags{.outer_momentum = 0.9}); },
             "--outer-momentum needs --outer-lr");
  expect_bad([] { levels_of("2:2,4:4", LevelFlags{.outer_nesterov = true}); },
             "--outer-nesterov needs --outer-lr");
}

}  // namespace
}  // namespace hsgd::apps
