#pragma once
// The examples' flags for the level options of the model averagers
// (framework/distributed/model_averaging/level_options.h): --hierarchy's text is read by
// distributed::parse_hierarchy (framework/distributed/model_averaging/hierarchy_text.h, which
// states the grammar, e.g. 1:2,16:4@outer=0.7/0.9/nesterov,overlap=2,bf16,ef); this file turns
// its errors into BadFlag and applies the top-level flags. Kept apart from parallel_training.cpp,
// which calls it.
//
// --outer-lr, --outer-momentum, --outer-nesterov, --overlap-steps, --compression,
// --compression-scale, --error-feedback set the same options on the top level (--mode
// hierarchical) or the only level (--mode local-sgd); a top level with '@' options as well is a
// BadFlag (give them in one place).

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "framework/distributed/model_averaging/level_options.h"

namespace hsgd::apps {

struct LevelFlags {
  double outer_lr = 0;  // 0: no outer optimizer
  double outer_momentum = 0;
  bool outer_nesterov = false;
  int64_t overlap_steps = 0;
  std::string compression = "none";  // none | bf16 | fp16
  float compression_scale = 1.0f;
  bool error_feedback = false;
};

void add_level_flags(CLI::App& app, LevelFlags& flags);

// Whether any of the flags differs from its default.
bool any_set(const LevelFlags& flags);

// distributed::parse_hierarchy(hierarchy), its InvalidArgument turned into BadFlag
// ("--hierarchy '...': ...").
std::vector<distributed::LevelOptions> parse_hierarchy_flag(const std::string& hierarchy);

// The levels for period:group_size pairs (parsed from hierarchy, or the local-sgd level with
// hierarchy ""), with the '@' options of hierarchy and the flags applied to the last level.
// Throws BadFlag naming the flag and the bad item.
std::vector<distributed::LevelOptions> make_level_options(
    const std::vector<std::pair<int64_t, int>>& pairs, const std::string& hierarchy,
    const LevelFlags& flags);

}  // namespace hsgd::apps
