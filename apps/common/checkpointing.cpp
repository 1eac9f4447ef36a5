#include "apps/common/checkpointing.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <utility>

#include "apps/common/parallel_training.h"
#include "framework/checkpoint/checkpoint_file.h"

namespace hsgd::apps {

namespace {

// The step of a "step_<N>" directory name, or -1 for any other name.
int64_t step_of(std::string_view name) {
  constexpr std::string_view kPrefix = "step_";
  if (name.size() <= kPrefix.size() || name.substr(0, kPrefix.size()) != kPrefix) return -1;
  int64_t step = 0;
  for (const char c : name.substr(kPrefix.size())) {
    if (c < '0' || c > '9' || step > (int64_t{1} << 50)) return -1;
    step = step * 10 + (c - '0');
  }
  return step;
}

}  // namespace

void check_checkpoint_flags(const CheckpointFlags& flags) {
  namespace fs = std::filesystem;
  const std::string& resume = flags.resume;
  if (resume == "auto" || resume == "never") return;
  const auto fail = [&resume](const std::string& why) {
    throw CLI::ValidationError("--resume", "'" + resume + "' " + why);
  };
  if (flags.dir.empty()) {
    fail("needs --checkpoint-dir DIR, where the resumed run writes its checkpoints");
  }
  std::error_code ec;
  if (!fs::is_directory(resume, ec)) {
    fail("is not a directory; expected auto, never or one checkpoint (DIR/step_N)");
  }
  if (fs::exists(fs::path(resume) / checkpoint::kManifestName, ec)) return;
  int64_t newest = -1;  // the newest complete checkpoint, if `resume` is a directory of them
  for (const fs::directory_entry& entry : fs::directory_iterator(resume, ec)) {
    const int64_t step = step_of(entry.path().filename().string());
    if (step >= 0 && fs::exists(entry.path() / checkpoint::kManifestName, ec)) {
      newest = std::max(newest, step);
    }
  }
  if (newest >= 0) {
    fail(
        "is a directory of checkpoints, not one checkpoint; give one of them (the newest "
        "complete one is " +
        (fs::path(resume) / ("step_" + std::to_string(newest))).string() +
        "), or --checkpoint-dir " + resume + " --resume auto to continue from it");
  }
  fail(std::string("has no ") + checkpoint::kManifestName +
       ": not a complete checkpoint; expected DIR/step_N as written by --checkpoint-dir DIR");
}

void add_checkpoint_flags(CLI::App& app, CheckpointFlags& flags) {
  app.add_option("--checkpoint-dir", flags.dir,
                 "Write checkpoints to DIR/step_<N>/ and resume from the newest complete one "
                 "(empty: no checkpoints)");
  app.add_option("--checkpoint-every", flags.every,
                 "Steps between checkpoints (0: at the end of every epoch)")
      ->capture_default_str();
  app.add_option("--resume", flags.resume,
                 "auto: resume from the newest complete checkpoint in --checkpoint-dir if there "
                 "is one; never: start fresh; or the path of one checkpoint (DIR/step_N)")
      ->capture_default_str();
  app.add_option("--keep-checkpoints", flags.keep_last, "Complete checkpoints kept")
      ->capture_default_str();
  app.parse_complete_callback([&flags] { check_checkpoint_flags(flags); });
}

runtime::CheckpointOptions checkpoint_options(const CheckpointFlags& flags) {
  HSGD_CHECK_AS(BadFlag, flags.every >= 0, "--checkpoint-every ", flags.every,
                " must be at least 0 (0: at the end of every epoch)");
  HSGD_CHECK_AS(BadFlag, flags.keep_last >= 1, "--keep-checkpoints ", flags.keep_last,
                " must be at least 1");
  HSGD_CHECK_AS(BadFlag, !flags.dir.empty() || flags.resume == "auto" || flags.resume == "never",
                "--resume '", flags.resume, "' needs --checkpoint-dir");
  return {
      .dir = flags.dir, .every = flags.every, .resume = flags.resume, .keep_last = flags.keep_last};
}

}  // namespace hsgd::apps
