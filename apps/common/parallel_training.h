#pragma once
// What the bundled examples (train_mlp, train_resnet) share to train data-parallel under
// hsgd-run: the --mode / --hierarchy / --warmup-steps / --period / --subgroup-size flags, and
// building DDP, the post-local SGD hook and the model averager from them.
//
// Usage:
//   CLI::App app{"train_mlp"};
//   apps::ParallelFlags parallel;
//   apps::add_parallel_flags(app, parallel);
//   // ... parse, build the model ...
//   auto world = comm::init_process_group(comm::InitOptions::from_env());
//   apps::Parallel setup = apps::make_parallel(model, world, parallel, model->buffers());
//   auto optimizer = setup.wrap(std::make_shared<optim::SGD>(model->parameters(),
//                                                            optim::SGDOptions{.lr = 0.1}));
//   Tensor logits = setup.forward(*model, batch.inputs);
//   { distributed::AveragedReplicas average(world, model); /* evaluate *model */ }  // the average
//
// Bad flag values throw apps::BadFlag (exit code 2 in the examples) naming the flag and value.

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "apps/common/level_options.h"
#include "comm/error.h"
#include "comm/process_group/process_group.h"
#include "framework/distributed/averaged_replicas.h"  // IWYU pragma: export (evaluation)
#include "framework/distributed/comm_hooks/post_local_sgd_hook.h"
#include "framework/distributed/ddp.h"
#include "framework/distributed/model_averaging/averagers.h"
#include "framework/nn/module.h"
#include "framework/train/optimizer.h"

namespace hsgd::apps {

struct ParallelFlags {
  std::string mode = "ddp";  // ddp | local-sgd | hierarchical
  int64_t warmup_steps = 0;
  int64_t period = 4;
  std::string hierarchy = "";
  int subgroup_size = 0;  // 0: the ranks of this node (intra_node_subgroup)
  LevelFlags levels;      // --outer-lr, --overlap-steps, --compression... (level_options.h)
};

// A flag value the program cannot use.
struct BadFlag : InvalidArgument {
  using InvalidArgument::InvalidArgument;
};

void add_parallel_flags(CLI::App& app, ParallelFlags& flags);

// Parses "P:G,P:G,..." (period:group_size pairs, positive integers), e.g. "2:2,4:4"; a group
// size of "world" or 0 is distributed::kWholeGroup (the whole group, whatever its size), "node"
// is distributed::kNodeGroup (the ranks of each node, which may differ in number). Level
// options after '@' (level_options.h) are skipped here.
std::vector<std::pair<int64_t, int>> parse_hierarchy(const std::string& text);

struct Parallel {
  // Null for --mode ddp in a world of one: the plain single-process program.
  std::unique_ptr<distributed::DistributedDataParallel> ddp;
  // Null in --mode ddp.
  std::shared_ptr<distributed::ModelAverager> averager;
  // The post-local SGD hook's state (its iteration counter); null in --mode ddp.
  std::shared_ptr<distributed::PostLocalSGDState> hook_state;

  Tensor forward(nn::Module& model, const Tensor& x) const {
    return ddp ? ddp->forward(x) : model.forward(x);
  }
  // The optimizer with the averager after each step (PostLocalSGDOptimizer), or as it is.
  std::shared_ptr<Optimizer> wrap(std::shared_ptr<Optimizer> optimizer) const;
  // "4 ranks, mode hierarchical, hierarchy 2:2,4:4, warm-up 20 steps".
  std::string describe(int world_size, const ParallelFlags& flags) const;
};

// Validates the flags against the world size, then builds DDP (with the post-local SGD hook
// outside --mode ddp) and the averager; average_buffers (e.g. BatchNorm statistics) are
// averaged with the parameters. Collective over world.
Parallel make_parallel(const std::shared_ptr<nn::Module>& model,
                       const std::shared_ptr<comm::ProcessGroup>& world, const ParallelFlags& flags,
                       std::vector<Tensor> average_buffers = {});

// Prints averager->level_stats() as a table (rank 0 calls it).
void print_averaging_stats(const distributed::ModelAverager& averager);

}  // namespace hsgd::apps
