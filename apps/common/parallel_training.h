#pragma once
// What the bundled examples (train_mlp, train_resnet) share to train data-parallel under
// hsgd-run: the --mode / --hierarchy / --warmup-steps / --period / --subgroup-size /
// --emulated-node-size flags, turned into the runtime's ParallelOptions
// (framework/runtime/parallel.h), which builds DDP, the post-local SGD hook and the model
// averager from them.
//
// Usage:
//   CLI::App app{"train_mlp"};
//   apps::ParallelFlags parallel;
//   apps::add_parallel_flags(app, parallel);
//   // ... parse ...
//   runtime::RuntimeOptions options{.parallel = apps::parallel_options(parallel)};
//
// Bad flag values throw apps::BadFlag (exit code 2 in the examples) naming the flag and value.

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "apps/common/level_options.h"
#include "comm/error.h"
#include "comm/process_group/process_group.h"
#include "framework/distributed/model_averaging/averagers.h"
#include "framework/runtime/parallel.h"

namespace hsgd::apps {

struct ParallelFlags {
  std::string mode = "ddp";  // ddp | local-sgd | hierarchical
  int64_t warmup_steps = 0;
  int64_t period = 4;
  std::string hierarchy = "";
  int subgroup_size = 0;  // 0: the ranks of this node (intra_node_subgroup)
  // --emulated-node-size N: blocks of N contiguous ranks play nodes (ParallelOptions).
  std::optional<int> emulated_node_size;
  LevelFlags levels;  // --outer-lr, --overlap-steps, --compression... (level_options.h)
};

// A flag value the program cannot use.
struct BadFlag : InvalidArgument {
  using InvalidArgument::InvalidArgument;
};

void add_parallel_flags(CLI::App& app, ParallelFlags& flags);

// The period:group_size pairs of --hierarchy's text (distributed::parse_hierarchy, whose grammar
// framework/distributed/model_averaging/hierarchy_text.h states), e.g. "2:2,4:4"; a group size
// of "world" or 0 is distributed::kWholeGroup (the whole group, whatever its size), "node" is
// distributed::kNodeGroup (the ranks of each node, which may differ in number). The '@' options
// are checked here and applied by make_level_options (level_options.h). Throws BadFlag
// ("--hierarchy '...': ...") naming the bad item.
std::vector<std::pair<int64_t, int>> parse_hierarchy(const std::string& text);

// The runtime's parallel options for the flags (validated: BadFlag naming the flag and value).
runtime::ParallelOptions parallel_options(const ParallelFlags& flags);

// The message of a ParallelMismatch (options that do not fit the world) in the flags' terms,
// naming the flag of the option that does not fit.
std::string describe_mismatch(const ParallelFlags& flags, const runtime::ParallelMismatch& e);

// "4 ranks, mode hierarchical, hierarchy 2:2,4:4, warm-up 20 steps"; with a local-sgd level that
// has options, the level too (parallel: the world's machinery, for the level kept).
std::string describe_parallel(const ParallelFlags& flags, int world_size,
                              const runtime::Parallel& parallel);

// Prints an averager's level_stats() as a table (rank 0 calls it).
void print_averaging_stats(const std::vector<distributed::AveragingLevelStats>& levels);

}  // namespace hsgd::apps
