#pragma once
// Durable runs for the bundled examples: the --checkpoint-dir / --checkpoint-every / --resume /
// --keep-checkpoints flags, turned into the runtime's CheckpointOptions
// (framework/runtime/runtime.h), which writes and resumes the checkpoints.
//
// Usage:
//   CLI::App app{"train_mlp"};
//   apps::CheckpointFlags checkpoint_flags;
//   apps::add_checkpoint_flags(app, checkpoint_flags);
//   // ... parse ...
//   runtime::RuntimeOptions options{.checkpoint = apps::checkpoint_options(checkpoint_flags)};
//
// With --resume auto (the default) a run whose --checkpoint-dir holds a complete checkpoint
// continues from it and rank 0 prints one line: "resumed from DIR/step_N (epoch E, step S)".
// Under hsgd-run --max-restarts a restarted attempt therefore continues without extra flags.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "framework/runtime/runtime.h"

namespace hsgd::apps {

struct CheckpointFlags {
  std::string dir = "";         // empty: no checkpoints
  int64_t every = 0;            // steps between checkpoints; 0: at the end of every epoch
  std::string resume = "auto";  // auto | never | the path of one checkpoint (DIR/step_N)
  int keep_last = 2;
};

// Adds the flags, and checks them as soon as the command line is parsed (app's
// parse_complete_callback, so before any data loads) with check_checkpoint_flags.
void add_checkpoint_flags(CLI::App& app, CheckpointFlags& flags);

// Throws CLI::ValidationError (a usage error: exit 2) when --resume names a path that is not one
// complete checkpoint: without --checkpoint-dir, not a directory, a directory of checkpoints
// (naming the newest complete one), or a directory without a manifest.
void check_checkpoint_flags(const CheckpointFlags& flags);

// The runtime's checkpoint options for the flags (BadFlag naming a bad value).
runtime::CheckpointOptions checkpoint_options(const CheckpointFlags& flags);

}  // namespace hsgd::apps
