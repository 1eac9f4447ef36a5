// framework/distributed/model_averaging/hierarchy_text.h: the hierarchy text read and written by
// one grammar. Round trips in both directions, and errors that name the text and the bad item.

#include "framework/distributed/model_averaging/hierarchy_text.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "comm/error.h"

namespace hsgd::distributed {
namespace {

// Every field, numbers in hexadecimal floating point: two levels print the same only when equal.
std::string fields(const std::vector<LevelOptions>& levels) {
  std::string out;
  char number[64];
  for (const LevelOptions& level : levels) {
    out +=
        "{period " + std::to_string(level.period) + ", group " + std::to_string(level.group_size);
    if (level.outer) {
      std::snprintf(number, sizeof(number), ", outer %a/%a%s", level.outer->lr,
                    level.outer->momentum, level.outer->nesterov ? "/nesterov" : "");
      out += number;
    }
    std::snprintf(number, sizeof(number), ", overlap %lld, fragments %lld, %s scale %a%s}",
                  static_cast<long long>(level.overlap_steps),
                  static_cast<long long>(level.fragments), to_string(level.compression),
                  static_cast<double>(level.compression_scale), level.error_feedback ? ", ef" : "");
    out += number;
  }
  return out;
}

// Level lists covering every option and group size spelling, with numbers that need all 17
// digits (0.1 + 0.2), tiny and huge ones, and float scales that are not short decimals.
std::vector<std::vector<LevelOptions>> level_lists() {
  using L = LevelOptions;
  return {
      {L{.period = 1, .group_size = 2}},
      {L{.period = 2, .group_size = kNodeGroup}, L{.period = 16, .group_size = kWholeGroup}},
      {L{.period = 2, .group_size = 2},
       L{.period = 16,
         .group_size = 8,
         .outer = OuterOptimizer{.lr = 0.7, .momentum = 0.9, .nesterov = true},
         .overlap_steps = 2,
         .compression = Compression::kBF16,
         .error_feedback = true}},
      {L{.period = 3,
         .group_size = 4,
         .outer = OuterOptimizer{.lr = 0.1 + 0.2},
         .compression = Compression::kFP16,
         .compression_scale = 1024.0f},
       L{.period = 9, .group_size = 1073741824, .overlap_steps = 7}},
      {L{.period = 1073741824,
         .group_size = kWholeGroup,
         .outer = OuterOptimizer{.lr = 1e-300, .momentum = 1.0 / 3.0},
         .compression = Compression::kFP16,
         .compression_scale = 1.0f / 3.0f,
         .error_feedback = true}},
      {L{.period = 4, .group_size = 0, .outer = OuterOptimizer{.lr = 123456789.0, .momentum = 0.0}},
       L{.period = 8,
         .group_size = kNodeGroup,
         .compression = Compression::kBF16,
         .compression_scale = 3.0e-38f}},
      {L{.period = 2, .group_size = kNodeGroup},
       L{.period = 16,
         .group_size = kWholeGroup,
         .outer = OuterOptimizer{.lr = 0.7, .momentum = 0.9, .nesterov = true},
         .overlap_steps = 1,
         .compression = Compression::kInt8,
         .error_feedback = true,
         .fragments = 4}},
  };
}

void expect_invalid(const std::string& text, const std::vector<std::string>& parts) {
  try {
    const auto levels = parse_hierarchy(text);
    ADD_FAILURE() << "'" << text << "' was accepted as " << fields(levels);
  } catch (const InvalidArgument& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("hierarchy '" + text + "': ", 0), 0u) << message;
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos)
          << "text '" << text << "': expected '" << part << "' in: " << message;
    }
  }
}

TEST(HierarchyTextTest, ParseOfFormat_GivesTheSameLevels) {
  const auto lists = level_lists();
  for (size_t i = 0; i < lists.size(); ++i) {
    const std::string text = format_hierarchy(lists[i]);
    const std::vector<LevelOptions> back = parse_hierarchy(text);
    EXPECT_TRUE(back == lists[i]) << "list " << i << " printed as '" << text << "'\nexpected "
                                  << fields(lists[i]) << "\nactual   " << fields(back);
  }
}

TEST(HierarchyTextTest, FormatOfParse_GivesTheCanonicalText) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"2:2,8:world", "2:2,8:world"},
      {"2:node,8:0", "2:node,8:world"},
      {"1:2,16:4@outer=0.7/0.9/nesterov,overlap=2,bf16,ef",
       "1:2,16:4@outer=0.7/0.9/nesterov,overlap=2,bf16,ef"},
      // Options in any order, the outer momentum left out, a scale of 1 written out.
      {"2:2@ef,fp16=1024,outer=0.5,4:4", "2:2@outer=0.5/0,fp16=1024,ef,4:4"},
      {"8:world@bf16=1,overlap=0", "8:world@bf16"},
      {"2:2@outer=5e-1/0.90", "2:2@outer=0.5/0.9"},
      {"16:world@overlap=3", "16:world@overlap=3"},
      {"2:node,16:world@ef,int4,outer=0.7", "2:node,16:world@outer=0.7/0,int4,ef"},
      {"4:4@int8", "4:4@int8"},
      // The run of the streaming example; fragments=1 is the default and is not written.
      {"2:node,16:world@fragments=4,int8", "2:node,16:world@fragments=4,int8"},
      {"2:node,16:world@int8,ef,fragments=4,overlap=2",
       "2:node,16:world@overlap=2,fragments=4,int8,ef"},
      {"8:world@fragments=1", "8:world"},
  };
  for (const auto& [text, canonical] : cases) {
    EXPECT_EQ(format_hierarchy(parse_hierarchy(text)), canonical) << "text '" << text << "'";
    EXPECT_EQ(format_hierarchy(parse_hierarchy(canonical)), canonical)
        << "text '" << canonical << "'";
  }
}

TEST(HierarchyTextTest, Parse_SetsEveryField) {
  const auto levels = parse_hierarchy("2:node,16:world@outer=0.7/0.9/nesterov,overlap=2,fp16=8,ef");
  ASSERT_EQ(levels.size(), 2u);
  EXPECT_TRUE(levels[0] == (LevelOptions{.period = 2, .group_size = kNodeGroup})) << fields(levels);
  const LevelOptions expected{.period = 16,
                              .group_size = kWholeGroup,
                              .outer = OuterOptimizer{.lr = 0.7, .momentum = 0.9, .nesterov = true},
                              .overlap_steps = 2,
                              .compression = Compression::kFP16,
                              .compression_scale = 8.0f,
                              .error_feedback = true};
  EXPECT_TRUE(levels[1] == expected) << fields(levels);
  EXPECT_EQ(describe(levels[1]), "16:world@outer=0.7/0.9/nesterov,overlap=2,fp16=8,ef");
  EXPECT_EQ(format_hierarchy({}), "");
  const auto streaming = parse_hierarchy("2:node,16:world@fragments=4,int8");
  ASSERT_EQ(streaming.size(), 2u);
  EXPECT_TRUE(streaming[1] == (LevelOptions{.period = 16,
                                            .group_size = kWholeGroup,
                                            .compression = Compression::kInt8,
                                            .fragments = 4}))
      << fields(streaming);
  EXPECT_EQ(streaming[0].fragments, 1);
}

TEST(HierarchyTextTest, BadPairs_NameTheItemAndTheExpectedForm) {
  const std::string pairs =
      "expected period:group_size pairs separated by commas, e.g. 2:2,8:world";
  expect_invalid("", {"empty", pairs});
  expect_invalid("2:x", {"group size 'x' is not a positive integer (or 0 / 'world': the whole "
                         "group, or 'node': each node's ranks)",
                         pairs});
  expect_invalid("2:nodes,8:world", {"group size 'nodes' is not a positive integer"});
  expect_invalid("0:2", {"period '0' is not a positive integer", pairs});
  expect_invalid("-1:2", {"period '-1' is not a positive integer"});
  expect_invalid("2:-2", {"group size '-2' is not a positive integer"});
  expect_invalid("2:2,4", {"entry '4' has no ':'", pairs});
  expect_invalid("2:2,,4:4", {"entry '' has no ':'"});
  expect_invalid("2:2,4:4,", {"entry '' has no ':'"});
  expect_invalid("2@bf16:2", {"entry '2@bf16:2' has no ':' before '@'"});
  expect_invalid("2:2 ", {"group size '2 ' is not a positive integer"});
  for (const std::string text : {"2:1073741825", "1073741825:2", "99999999999999999999:4"}) {
    expect_invalid(text, {"is too large (at most 1073741824)"});
  }
}

TEST(HierarchyTextTest, BadOptions_NameTheLevelAndTheOption) {
  expect_invalid("2:2,4:4@zip",
                 {"level 1: unknown level option 'zip'",
                  "expected outer=LR[/MOMENTUM[/nesterov]], overlap=K, fragments=F, bf16[=SCALE], "
                  "fp16[=SCALE], int8, int4 or ef"});
  expect_invalid("4:4@int8=2", {"level 0: unknown level option 'int8=2'"});
  expect_invalid("2:2@ef=1,4:4", {"level 0: unknown level option 'ef=1'"});
  expect_invalid("2:2@", {"level 0: unknown level option ''"});
  expect_invalid("2:2,4:4@outer=fast", {"level 1: outer lr 'fast' is not a number",
                                        "expected outer=LR[/MOMENTUM[/nesterov]]"});
  expect_invalid("2:2,4:4@outer=1/x", {"outer momentum 'x' is not a number"});
  expect_invalid("2:2,4:4@outer=1/0.9/heavy", {"outer '1/0.9/heavy' has an unknown part"});
  expect_invalid("2:2,4:4@outer=1/0.9/nesterov/x",
                 {"outer '1/0.9/nesterov/x' has an unknown part"});
  expect_invalid("2:2,4:4@outer=1e999", {"outer lr '1e999' is out of range"});
  expect_invalid("4:4@overlap=1.5", {"overlap '1.5' is not an integer"});
  expect_invalid("4:4@fragments=two",
                 {"level 0: fragments 'two' is not an integer", "expected fragments=F, F >= 1"});
  expect_invalid("4:4@fragments", {"level 0: unknown level option 'fragments'"});
  expect_invalid("2:2,fragments=2", {"option 'fragments=2' must follow '@' on a level"});
  expect_invalid("4:4@bf16=big", {"scale 'big' is not a number", "expected bf16[=SCALE]"});
  expect_invalid("4:4@scale=2", {"option 'scale=2' needs a compression", "bf16=SCALE"});
  expect_invalid("2:2,bf16,4:4", {"option 'bf16' must follow '@' on a level, e.g. 2:2@bf16"});
  expect_invalid("ef", {"option 'ef' must follow '@' on a level, e.g. 16:4@ef"});
}

}  // namespace
}  // namespace hsgd::distributed
