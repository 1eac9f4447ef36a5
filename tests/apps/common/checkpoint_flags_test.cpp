// The checkpoint flags of the example programs: a --resume that cannot work is a usage error
// when the command line is parsed, before any data loads, and says what was expected.
#include <gtest/gtest.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "apps/common/checkpointing.h"

namespace {

namespace fs = std::filesystem;

// Parses args with the checkpoint flags; returns the usage error's message, or "" when none.
std::string parse_error(std::vector<std::string> args) {
  CLI::App app{"checkpoint_flags_test"};
  hsgd::apps::CheckpointFlags flags;
  hsgd::apps::add_checkpoint_flags(app, flags);
  std::vector<const char*> argv{"checkpoint_flags_test"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

class CheckpointFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("hsgd_ckpt_flags_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  // A step_N directory, complete (with a manifest) or not.
  fs::path make_step(int64_t step, bool complete) {
    const fs::path dir = root_ / "ckpt" / ("step_" + std::to_string(step));
    fs::create_directories(dir);
    if (complete) std::ofstream(dir / "manifest") << "x";
    return dir;
  }
  fs::path root_;
};

TEST_F(CheckpointFlagsTest, ResumeAPathNeedsCheckpointDir) {
  const fs::path step = make_step(10, true);
  const std::string error = parse_error({"--resume", step.string()});
  EXPECT_NE(error.find("--resume: '" + step.string() + "' needs --checkpoint-dir DIR"),
            std::string::npos)
      << error;
  EXPECT_EQ(parse_error({"--resume", "never"}), "");
  EXPECT_EQ(parse_error({"--resume", "auto"}), "");
}

TEST_F(CheckpointFlagsTest, DirectoryOfCheckpointsNamesTheNewestComplete) {
  make_step(10, true);
  make_step(120, true);
  make_step(130, false);  // a save in progress: no manifest yet
  const fs::path dir = root_ / "ckpt";
  const std::string error =
      parse_error({"--checkpoint-dir", (root_ / "out").string(), "--resume", dir.string()});
  EXPECT_NE(error.find("is a directory of checkpoints, not one checkpoint"), std::string::npos)
      << error;
  EXPECT_NE(error.find("the newest complete one is " + (dir / "step_120").string()),
            std::string::npos)
      << error;
}

TEST_F(CheckpointFlagsTest, OneCompleteCheckpointIsAccepted) {
  const fs::path step = make_step(10, true);
  EXPECT_EQ(parse_error({"--checkpoint-dir", (root_ / "out").string(), "--resume", step.string()}),
            "");
}

TEST_F(CheckpointFlagsTest, IncompleteOrMissingCheckpointIsNamed) {
  const fs::path partial = make_step(20, false);
  std::string error =
      parse_error({"--checkpoint-dir", (root_ / "out").string(), "--resume", partial.string()});
  EXPECT_NE(error.find("has no manifest: not a complete checkpoint"), std::string::npos) << error;
  error = parse_error(
      {"--checkpoint-dir", (root_ / "out").string(), "--resume", (root_ / "nope").string()});
  EXPECT_NE(error.find("is not a directory"), std::string::npos) << error;
}

}  // namespace
