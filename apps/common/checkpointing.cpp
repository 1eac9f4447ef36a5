#include "apps/common/checkpointing.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <utility>

#include "comm/launcher/worker_liveness.h"
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

RunCheckpoints::RunCheckpoints(const CheckpointFlags& flags,
                               std::shared_ptr<comm::ProcessGroup> world, checkpoint::RunInfo run,
                               Resumable objects)
    : flags_(flags), world_(std::move(world)), objects_(std::move(objects)) {
  HSGD_CHECK_AS(BadFlag, flags_.every >= 0, "--checkpoint-every ", flags_.every,
                " must be at least 0 (0: at the end of every epoch)");
  HSGD_CHECK_AS(BadFlag, flags_.keep_last >= 1, "--keep-checkpoints ", flags_.keep_last,
                " must be at least 1");
  if (flags_.dir.empty()) {
    HSGD_CHECK_AS(BadFlag, flags_.resume == "auto" || flags_.resume == "never", "--resume '",
                  flags_.resume, "' needs --checkpoint-dir");
    return;
  }
  checkpointer_ = std::make_unique<checkpoint::Checkpointer>(
      checkpoint::CheckpointOptions{.dir = flags_.dir, .keep_last = flags_.keep_last}, world_,
      std::move(run));
  checkpoint::Checkpointer& c = *checkpointer_;
  c.add_module("model", objects_.model);
  c.add("optimizer", objects_.optimizer);
  if (objects_.scheduler != nullptr) c.add("scheduler", *objects_.scheduler);
  if (objects_.loader != nullptr) c.add("loader", *objects_.loader);
  if (objects_.parallel != nullptr && objects_.parallel->averager) {
    c.add("averager", objects_.parallel->averager);
  }
  if (objects_.parallel != nullptr && objects_.parallel->hook_state) {
    c.add("post_local_hook", objects_.parallel->hook_state);
  }
}

int64_t RunCheckpoints::resume() {
  // hsgd-run counts the steps lost to restarts from the step each attempt starts at.
  std::optional<checkpoint::LoadedCheckpoint> loaded;
  if (checkpointer_ && flags_.resume != "never") loaded = checkpointer_->load(flags_.resume);
  comm::report_progress(loaded ? loaded->step : 0);
  if (!loaded) return 0;
  last_saved_ = loaded->step;
  if (world_->rank() == 0) {
    const data::DataLoader* loader = objects_.loader;
    std::printf("resumed from %s (epoch %lld, step %lld)%s\n", loaded->path.c_str(),
                static_cast<long long>(loader ? loader->epoch() + 1 : 0),
                static_cast<long long>(loaded->step),
                loaded->resized ? " on a different number of workers" : "");
    std::fflush(stdout);
  }
  return loaded->step;
}

bool RunCheckpoints::replicas_equal(int64_t step) const {
  if (world_->size() == 1) return true;
  const Parallel* parallel = objects_.parallel;
  if (parallel == nullptr || !parallel->averager) return true;  // DDP: gradients averaged
  // During the warm-up the post-local hook averages gradients over the world.
  if (step <= objects_.warmup_steps) return true;
  return parallel->averager->averaged_whole_group_last_step();
}

void RunCheckpoints::after_step(int64_t step, bool end_of_epoch) {
  if (!checkpointer_ || step <= last_saved_) return;
  const bool due = flags_.every > 0 ? step % flags_.every == 0 : end_of_epoch;
  if (!due) return;
  checkpointer_->save(step, {.replicas_equal = replicas_equal(step)});
  last_saved_ = step;
}

void RunCheckpoints::save_now(int64_t step) {
  if (!checkpointer_ || step <= last_saved_) return;
  checkpointer_->save(step, {.replicas_equal = replicas_equal(step)});
  last_saved_ = step;
}

void RunCheckpoints::finish() {
  if (checkpointer_) checkpointer_->wait();
}

}  // namespace hsgd::apps
