#pragma once
// HierarchicalModelAverager: hierarchical SGD (arXiv 2010.12998), like torch's
// torch.distributed.algorithms.model_averaging.hierarchical_model_averager.
//
// period_group_size maps an averaging period to a group size, in the given order, e.g.
// {{2, 2}, {4, 8}}: every 2 steps each pair of ranks averages, every 4 steps all 8 do. A group
// of size g is made of contiguous ranks of pg (new_subgroups); the last size must be pg's size
// (the top level uses pg itself), or kWholeGroup (0), which means pg's size whatever it is.
//
// One hierarchy for every world size (beyond torch): levels that do not fit in pg, i.e. larger
// than pg or after a level that already is the whole group, are dropped with one warning (on
// rank 0). {{2, 2}, {8, kWholeGroup}} thus runs as {{2, 2}, {8, 4}} on 4 ranks, {{2, 2}} on 2
// and {{8, 1}} on 1. period_group_size() and level_stats() describe the levels kept. At each call,
// once step >= warmup_steps, the LARGEST period dividing step selects the one group that averages
// (the smaller groups are inside it, so averaging them too would be redundant); then step += 1.
//
// Validation, beyond torch (hsgd::InvalidArgument on every rank, naming the entry):
// - the list is non-empty; periods are >= 1 and strictly increasing;
// - group sizes are >= 1 (or kWholeGroup, last only), strictly increasing, each dividing the
//   next; after dropping what does not fit, the last equals pg->size();
// - warmup_steps >= 0;
// - every rank passed the same list and warm-up (checked collectively, see config_check.h).
// A largest period of 1 only warns. Construction is collective over pg.
//
// Level options (level_options.h; the schedule of levels with options is in averagers.h): the
// constructor taking LevelOptions gives each level an outer optimizer, overlap or compression.
// Bad options throw on every rank naming the level and the value ("level 1 (16:4@overlap=-1):
// overlap_steps must be >= 0, got -1"); the cross-rank check covers them. The constructors
// taking (period, group size) pairs build plain levels: exactly torch's averaging. (The
// initializer_list overload only keeps `averager({{2, 2}, {4, 4}}, ...)` unambiguous.)
//
// Usage (8 ranks, 2 nodes of 4):
//   HierarchicalModelAverager averager({{2, 4}, {8, 8}}, /*warmup_steps=*/100, pg);
//   optimizer->step();
//   averager.average_parameters(model->parameters());   // after every optimizer step
//   for (const auto& level : averager.level_stats()) std::cout << level.period << level.bytes;
//
//   // DiLoCo across nodes, overlapped and in bf16; pairs average plainly every 2 steps:
//   HierarchicalModelAverager diloco(
//       {LevelOptions{.period = 2, .group_size = 4},
//        LevelOptions{.period = 32, .group_size = 8,
//                     .outer = OuterOptimizer{.lr = 0.7, .momentum = 0.9, .nesterov = true},
//                     .overlap_steps = 2, .compression = Compression::kBF16}},
//       100, pg);

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "comm/process_group/process_group.h"
#include "framework/distributed/model_averaging/averagers.h"

namespace hsgd::distributed {

class HierarchicalModelAverager : public ModelAverager {
 public:
  HierarchicalModelAverager(std::vector<std::pair<int64_t, int>> period_group_size,
                            int64_t warmup_steps, std::shared_ptr<comm::ProcessGroup> pg,
                            ModelAveragerOptions options = {});
  HierarchicalModelAverager(std::initializer_list<std::pair<int64_t, int>> period_group_size,
                            int64_t warmup_steps, std::shared_ptr<comm::ProcessGroup> pg,
                            ModelAveragerOptions options = {});
  HierarchicalModelAverager(std::vector<LevelOptions> levels, int64_t warmup_steps,
                            std::shared_ptr<comm::ProcessGroup> pg,
                            ModelAveragerOptions options = {});

  using ModelAverager::average_parameters;
  void average_parameters(const std::vector<Tensor>& params) override;

  int64_t warmup_steps() const { return warmup_steps_; }
  // The levels kept (sizes resolved), not necessarily the list given.
  const std::vector<std::pair<int64_t, int>>& period_group_size() const {
    return period_group_size_;
  }
  // This rank's group at each level (the last is pg itself).
  const std::vector<std::shared_ptr<comm::ProcessGroup>>& level_groups() const { return groups_; }
  // The level that averages at the given step, or -1 when none does.
  int level_at(int64_t step) const;

 protected:
  // step >= warmup_steps, step % period == offset, and no level above averages at step.
  bool fragment_starts(size_t level, int64_t offset, int64_t step) const override;

 private:
  // The levels kept from given (kWholeGroup, and kNodeGroup when nodes is one node, resolved to
  // pg_size), in order; the others are appended to dropped. nodes: the ranks of each node (empty
  // without node levels).
  static std::vector<LevelOptions> resolve(const std::vector<LevelOptions>& given, int pg_size,
                                           const std::vector<std::vector<int>>& nodes,
                                           std::vector<LevelOptions>* dropped);

  // Constant after construction.
  const int64_t warmup_steps_;
  std::vector<std::pair<int64_t, int>> period_group_size_;  // as kept, see resolve()
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups_;
};

}  // namespace hsgd::distributed
