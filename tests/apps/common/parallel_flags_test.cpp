// apps/common/parallel_training.h: --emulated-node-size parsed into ParallelOptions, refused with
// a message naming the value when below 1 or with --mode ddp, and a ParallelMismatch of the
// runtime named by the flag of the option that does not fit.

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <string>

#include "apps/common/parallel_training.h"

namespace hsgd::apps {
namespace {

// The flags as parsed from a command line without the program name.
ParallelFlags parse(const std::string& command_line) {
  CLI::App app{"test"};
  ParallelFlags flags;
  add_parallel_flags(app, flags);
  app.parse(command_line, /*program_name_included=*/false);
  return flags;
}

// The BadFlag message of parallel_options(flags), or "" when it accepts them.
std::string refusal(const ParallelFlags& flags) {
  try {
    parallel_options(flags);
  } catch (const BadFlag& e) {
    return e.what();
  }
  return "";
}

TEST(ParallelFlagsTest, EmulatedNodeSize_ParsedIntoTheRuntimeOptions) {
  const runtime::ParallelOptions given = parallel_options(
      parse("--mode hierarchical --hierarchy 2:node,8:world --emulated-node-size 2"));
  EXPECT_EQ(given.emulated_node_size, 2);
  EXPECT_EQ(given.subgroup_size, 0);
  EXPECT_EQ(parallel_options(parse("--mode local-sgd")).emulated_node_size, 0)
      << "without the flag the nodes are the launcher's";
}

TEST(ParallelFlagsTest, EmulatedNodeSize_BelowOneOrWithDDP_IsRefusedNamingTheValue) {
  for (const std::string value : {"0", "-2"}) {
    const std::string message = refusal(
        parse("--mode hierarchical --hierarchy 2:node,8:world --emulated-node-size " + value));
    EXPECT_NE(message.find("--emulated-node-size " + value + " must be at least 1"),
              std::string::npos)
        << "value " << value << ": '" << message << "'";
  }
  const std::string ddp = refusal(parse("--emulated-node-size 2"));
  EXPECT_NE(ddp.find("--emulated-node-size 2 needs --mode local-sgd or hierarchical, not 'ddp'"),
            std::string::npos)
      << ddp;
}

TEST(ParallelFlagsTest, Mismatch_NamesTheFlagOfTheOptionThatDoesNotFit) {
  const ParallelFlags flags = parse(
      "--mode hierarchical --hierarchy 2:node,8:world --emulated-node-size 3 "
      "--subgroup-size 5");
  const std::string emulated = describe_mismatch(
      flags, runtime::ParallelMismatch("emulated_node_size 3 must divide the world size 4", 4,
                                       "emulated_node_size"));
  EXPECT_EQ(emulated,
            "--emulated-node-size 3 with 4 ranks: emulated_node_size 3 must divide the world "
            "size 4");
  const std::string subgroup = describe_mismatch(
      flags, runtime::ParallelMismatch("subgroup_size 5 must divide the world size 4", 4,
                                       "subgroup_size"));
  EXPECT_EQ(subgroup.rfind("--subgroup-size 5: ", 0), 0u) << subgroup;
  const std::string levels =
      describe_mismatch(flags, runtime::ParallelMismatch("last group size 2 ...", 4));
  EXPECT_EQ(levels.rfind("--hierarchy '2:node,8:world' with 4 ranks: ", 0), 0u) << levels;
}

}  // namespace
}  // namespace hsgd::apps
