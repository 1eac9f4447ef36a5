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
// Usage:
//   runtime::Parallel parallel = runtime::make_parallel(
//       model, world,
//       {.mode = runtime::Mode::kHierarchical,
//        .levels = distributed::parse_hierarchy("2:node,16:world@outer=0.7/0.9"),
//        .warmup_steps = 100});
//   Tensor logits = parallel.forward(*model, batch.inputs);  // through DDP when there is one
//   // after optimizer->step():
//   parallel.averager->average_parameters(model->parameters());
//
// Bad options throw hsgd::InvalidArgument naming the option (field) and its value.

#include <cstdint>
#include <memory>
#include <string>
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
  int64_t warmup_steps = 0;  // >= 0
  int subgroup_size = 0;     // >= 0, see the file comment
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
// world's size, a subgroup size that does not divide it); what() is the averager's message.
class ParallelMismatch : public InvalidArgument {
 public:
  ParallelMismatch(const std::string& what, int world_size)
      : InvalidArgument(what), world_size_(world_size) {}
  int world_size() const { return world_size_; }

 private:
  int world_size_;
};

// Validates options against the world (ParallelMismatch), then builds DDP (with the post-local SGD
// hook outside kDDP) and the averager; average_buffers (e.g. BatchNorm statistics) are averaged
// with the parameters. Collective over world.
Parallel make_parallel(const std::shared_ptr<nn::Module>& model,
                       const std::shared_ptr<comm::ProcessGroup>& world,
                       const ParallelOptions& options, std::vector<Tensor> average_buffers = {});

}  // namespace hsgd::runtime
