#pragma once
// Parallel: the data-parallel machinery of one world, built from ParallelOptions --
// DistributedDataParallel, the post-local SGD hook and a model averager -- as a program would
// wire them by hand (README's program). The Runtime (runtime.h) builds one per generation; a
// program that drives its own loop may call make_parallel directly.
//
//   kDDP           DDP, gradients averaged over the world every step (no DDP wrapper in a
//                  world of one: the plain single-process program).
//   kLocalSGD      DDP with post_localSGD_hook (start_localSGD_iter = warmup_steps; then
//                  gradients averaged within subgroup_size ranks) + PeriodicModelAverager over
//                  levels[0] (its period and options).
//   kHierarchical  the same hook + HierarchicalModelAverager(levels, warmup_steps); levels larger
//                  than the world are dropped with a warning.
// subgroup_size: 0 is the ranks of this node (intra_node_subgroup), 1 no gradient allreduce after
// the warm-up (pure local SGD), N > 1 contiguous groups of N ranks.
//
// emulated_node_size (testing a hierarchy on one machine): N > 0 treats each block of N
// contiguous ranks as a node, for the post-local gradient group (subgroup_size 0) and for 'node'
// levels (kNodeGroup), so that 2:node,8:world on 4 ranks of one machine with N = 2 averages as
// on 2 nodes of 2: ranks {0, 1} and {2, 3} keep identical replicas (their gradients are averaged
// within the emulated node), the two pairs drift apart and meet every 8 steps. N must divide the
// world size. Without it, all ranks of one machine are one node: the post-local gradient group
// is the whole world, so the replicas stay identical and averaging changes nothing (a warning
// says so), and a 'node' level is the whole world, which drops the levels above it (warned too).
// Only the grouping is emulated: the ranks still talk through shared memory, and compression
// (level_options.h) still sees one node, so it rounds nothing.
//
// Usage:
//   runtime::Parallel parallel = runtime::make_parallel(
//       model, world,
//       {.mode = runtime::Mode::kHierarchical,
//        .levels = distributed::parse_hierarchy("2:node,16:world@outer=0.7/0.9"),
//        .warmup_steps = 100});
//   // The same on one machine of 4 ranks, as 2 nodes of 2:
//   //   {..., .warmup_steps = 100, .emulated_node_size = 2}
//   Tensor logits = parallel.forward(*model, batch.inputs);  // through DDP when there is one
//   // after optimizer->step():
//   parallel.averager->average_parameters(model->parameters());
//
// Bad options throw hsgd::InvalidArgument naming the option (field) and its value.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group/process_group.h"
#include "framework/distributed/comm_hooks/post_local_sgd_hook.h"
#include "framework/distributed/ddp.h"
#include "framework/distributed/model_averaging/averagers.h"
#include "framework/distributed/model_averaging/hierarchy_text.h"  // levels from text
#include "framework/distributed/model_averaging/level_options.h"
#include "framework/nn/module.h"

namespace hsgd::runtime {

enum class Mode { kDDP, kLocalSGD, kHierarchical };

// "ddp", "local-sgd", "hierarchical".
const char* mode_name(Mode mode);

struct ParallelOptions {
  Mode mode = Mode::kDDP;
  // kLocalSGD: one level (its period and options; the group is the world). kHierarchical: the
  // levels, bottom first. Empty in kDDP.
  std::vector<distributed::LevelOptions> levels{};
  int64_t warmup_steps = 0;    // >= 0
  int subgroup_size = 0;       // >= 0, see the file comment
  int emulated_node_size = 0;  // >= 0; 0: the nodes as launched; see the file comment
};

// The first problem of options that needs no world (mode and levels agree, counts in range), or
// "" when there is none.
std::string check(const ParallelOptions& options);

struct Parallel {
  // Null in kDDP in a world of one.
  std::unique_ptr<distributed::DistributedDataParallel> ddp;
  // Null in kDDP.
  std::shared_ptr<distributed::ModelAverager> averager;
  // The post-local SGD hook's state (its iteration counter); null in kDDP.
  std::shared_ptr<distributed::PostLocalSGDState> hook_state;

  Tensor forward(nn::Module& model, const Tensor& x) const {
    return ddp ? ddp->forward(x) : model.forward(x);
  }
  Tensor forward(nn::Module& model, const IndexTensor& ids) const {
    return ddp ? ddp->forward(ids) : model.forward(ids);
  }
};

// The options do not fit the world they are built for (a hierarchy whose last group is not the
// world's size, a subgroup or emulated node size that does not divide it); what() is the
// averager's message. option() names the field of ParallelOptions that does not fit: "levels",
// "subgroup_size" or "emulated_node_size".
class ParallelMismatch : public InvalidArgument {
 public:
  ParallelMismatch(const std::string& what, int world_size, std::string option = "levels")
      : InvalidArgument(what), world_size_(world_size), option_(std::move(option)) {}
  int world_size() const { return world_size_; }
  const std::string& option() const { return option_; }

 private:
  int world_size_;
  std::string option_;
};

// Validates options against the world (ParallelMismatch), then builds DDP (with the post-local SGD
// hook outside kDDP) and the averager; average_buffers (e.g. BatchNorm statistics) are averaged
// with the parameters. Collective over world.
Parallel make_parallel(const std::shared_ptr<nn::Module>& model,
                       const std::shared_ptr<comm::ProcessGroup>& world,
                       const ParallelOptions& options, std::vector<Tensor> average_buffers = {});

}  // namespace hsgd::runtime
