#include "apps/common/parallel_training.h"

#include <cstdio>

namespace hsgd::apps {

void add_parallel_flags(CLI::App& app, ParallelFlags& flags) {
  app.add_option("--mode", flags.mode,
                 "ddp: gradient allreduce every step; local-sgd: post-local SGD with periodic "
                 "model averaging; hierarchical: post-local SGD with hierarchical averaging")
      ->capture_default_str()
      ->check(CLI::IsMember({"ddp", "local-sgd", "hierarchical"}));
  app.add_option("--warmup-steps", flags.warmup_steps,
                 "local-sgd/hierarchical: steps of global gradient averaging before local SGD "
                 "and model averaging start")
      ->capture_default_str();
  app.add_option("--period", flags.period, "local-sgd: average the models every N steps")
      ->capture_default_str();
  app.add_option("--hierarchy", flags.hierarchy,
                 "hierarchical: period:group_size pairs, e.g. 2:2,8:world (every 2 steps pairs of "
                 "ranks average, every 8 steps all of them); the last size is the world size, "
                 "or 'world' (or 0) for any world size; 'node' is the ranks of each node, "
                 "e.g. 2:node,8:world, also when nodes run different numbers of ranks; levels "
                 "larger than the world are dropped with a warning");
  app.add_option("--subgroup-size", flags.subgroup_size,
                 "local-sgd/hierarchical: ranks that average gradients after warm-up (0: the "
                 "ranks of this node, however many each node runs; 1: none)")
      ->capture_default_str();
  app.add_option("--emulated-node-size", flags.emulated_node_size,
                 "local-sgd/hierarchical, to test a hierarchy on one machine: treat each block "
                 "of N contiguous ranks as a node, for the gradient group after warm-up and for "
                 "'node' levels (e.g. 4 ranks, N = 2, --hierarchy 2:node,8:world: 2 nodes of 2); "
                 "N must divide the number of ranks");
  add_level_flags(app, flags.levels);
}

std::vector<std::pair<int64_t, int>> parse_hierarchy(const std::string& text) {
  std::vector<std::pair<int64_t, int>> pairs;
  for (const distributed::LevelOptions& level : parse_hierarchy_flag(text)) {
    pairs.emplace_back(level.period, level.group_size);
  }
  return pairs;
}

std::string describe_parallel(const ParallelFlags& flags, int world_size,
                              const runtime::Parallel& parallel) {
  std::string text = std::to_string(world_size) + " ranks, mode " + flags.mode;
  if (flags.mode == "local-sgd") text += ", period " + std::to_string(flags.period);
  if (parallel.averager && flags.mode == "local-sgd" &&
      !distributed::is_plain(parallel.averager->level_options()[0])) {
    text += ", level " + distributed::describe(parallel.averager->level_options()[0]);
  }
  if (flags.mode == "hierarchical") text += ", hierarchy " + flags.hierarchy;
  if (flags.emulated_node_size) {
    text += ", emulated nodes of " + std::to_string(*flags.emulated_node_size) + " ranks";
  }
  if (flags.mode != "ddp") text += ", warm-up " + std::to_string(flags.warmup_steps) + " steps";
  return text;
}

runtime::ParallelOptions parallel_options(const ParallelFlags& flags) {
  HSGD_CHECK_AS(BadFlag, flags.warmup_steps >= 0, "--warmup-steps ", flags.warmup_steps,
                " must be at least 0");
  HSGD_CHECK_AS(BadFlag, flags.period >= 1, "--period ", flags.period, " must be at least 1");
  HSGD_CHECK_AS(BadFlag, flags.subgroup_size >= 0, "--subgroup-size ", flags.subgroup_size,
                " must be at least 0 (0: the ranks of this node)");
  if (flags.emulated_node_size) {
    HSGD_CHECK_AS(BadFlag, *flags.emulated_node_size >= 1, "--emulated-node-size ",
                  *flags.emulated_node_size,
                  " must be at least 1 (the ranks of each emulated node; leave the flag out to "
                  "use the nodes as launched)");
    HSGD_CHECK_AS(BadFlag, flags.mode != "ddp", "--emulated-node-size ", *flags.emulated_node_size,
                  " needs --mode local-sgd or hierarchical, not 'ddp' (DDP averages gradients "
                  "over all ranks at every step, wherever they run)");
  }
  runtime::ParallelOptions out{.warmup_steps = flags.warmup_steps,
                               .subgroup_size = flags.subgroup_size,
                               .emulated_node_size = flags.emulated_node_size.value_or(0)};
  if (flags.mode == "hierarchical") {
    out.mode = runtime::Mode::kHierarchical;
    out.levels =
        make_level_options(parse_hierarchy(flags.hierarchy), flags.hierarchy, flags.levels);
  } else if (flags.mode == "local-sgd") {
    out.mode = runtime::Mode::kLocalSGD;
    out.levels = make_level_options({{flags.period, 0}}, "", flags.levels);
  } else if (any_set(flags.levels)) {
    throw BadFlag(
        "--outer-lr/--outer-momentum/--overlap-steps/--compression... need --mode "
        "local-sgd or hierarchical, not '" +
        flags.mode + "'");
  }
  if (flags.mode != "hierarchical" && !flags.hierarchy.empty()) {
    throw BadFlag("--hierarchy '" + flags.hierarchy + "' needs --mode hierarchical, not '" +
                  flags.mode + "'");
  }
  return out;
}

std::string describe_mismatch(const ParallelFlags& flags, const runtime::ParallelMismatch& e) {
  if (e.option() == "emulated_node_size") {
    return str_cat("--emulated-node-size ", flags.emulated_node_size.value_or(0), " with ",
                   e.world_size(), " ranks: ", e.what());
  }
  if (e.option() == "subgroup_size") {
    return str_cat("--subgroup-size ", flags.subgroup_size, ": ", e.what());
  }
  // The averager names its API (group size 0, kWholeGroup); the flags spell it 'world'.
  if (flags.mode == "local-sgd") return std::string("--mode local-sgd: ") + e.what();
  return str_cat("--hierarchy '", flags.hierarchy, "' with ", e.world_size(), " ranks: ", e.what(),
                 " (in --hierarchy, group size 'world' or 0 is the whole group)");
}

void print_averaging_stats(const std::vector<distributed::AveragingLevelStats>& levels) {
  std::printf("model averaging per level (rank 0): %8s %10s %8s %10s %10s %12s %12s\n", "period",
              "group_size", "calls", "MB", "seconds", "overlap_wait", "peak_MB/s");
  for (const distributed::AveragingLevelStats& level : levels) {
    std::printf("model averaging level: %8lld %10d %8lld %10.3f %10.3f %12.3f %12.3f\n",
                static_cast<long long>(level.period), level.group_size,
                static_cast<long long>(level.calls), static_cast<double>(level.bytes) / 1e6,
                level.seconds, level.overlap_wait_seconds, level.peak_bytes_per_second / 1e6);
  }
}

}  // namespace hsgd::apps
