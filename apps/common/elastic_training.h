#pragma once
// Elastic training for the bundled examples: under hsgd-run --nnodes MIN:MAX (which sets
// HSGD_ELASTIC_NODE_ID) a worker trains through the job's generations
// (comm/elastic/elastic_world.h) instead of one fixed world. A lost node does not stop the
// others, and a node that joins receives the state of a live peer over the network.
//
// Per generation: the world group, DDP, the post-local SGD hook and the averager are built anew
// for the generation's ranks (the hierarchy is resolved again: 'node' and 'world' follow the
// members; fixed sizes that no longer fit are dropped as make_parallel does), and the data loader
// continues the epoch on the new partition from the samples consumed so far.
//
// Entering a generation (collective over its world), every rank says the step its state is at
// (a joining node: none). Let S be the highest step and F the ranks at S:
//   - outside --mode ddp, with more than one rank in F and after a failure, the ranks of F
//     average their parameters and averaged buffers (the others contribute nothing): the top-level
//     averaging that the lost node interrupted, applied by every survivor, never half;
//   - the lowest rank of F sends its whole state (parameters, buffers, optimizer, LR scheduler,
//     data position, step, epoch) to every rank outside F: joining nodes, and survivors that
//     were behind (stopped at an earlier step in a level shared with the lost node; their local
//     steps since are dropped);
//   - every rank compares a hash of its parameters with the others' and fails the job when they
//     differ.
// Optimizer state and buffers that are not averaged (BatchNorm statistics in --mode ddp) stay
// each rank's own on the ranks of F, as in a run without failures. Before all this, the ranks
// compare their configuration (model tensors and shapes, mode, levels, optimizer, batch): a
// node whose configuration differs from the job's is refused by name and exits
// comm::launcher::kExitWillRepeat (78), so that its hsgd-run does not restart it.
//
// When generations change:
//   - a failure: a collective throws (a closed peer at once; a vanished host when its agent's
//     heartbeat stops and the next generation drops it, or at the collective timeout
//     HSGD_TIMEOUT_MS). In a step whose gradient allreduce failed (--mode ddp, warm-up, the
//     post-local group) the step is discarded on every rank and recomputed in the next
//     generation from the same data position; a failure in the averaging after the optimizer
//     step counts the step as done and lets the next generation's averaging replace it;
//   - a join: at the next step where every replica is the same (every step in --mode ddp and
//     during warm-up, else after an averaging over the whole world), the ranks agree (one 8-byte
//     allreduce) whether the agents announced a newer generation, and move to it together.
//     With overlap, the vote is at the step that starts an averaging over the whole world; to
//     move, every rank completes that averaging at once (no local step since its snapshot: the
//     replicas are then equal, as without overlap), so nothing is in flight at a join.
// Overlap under a failure: an averaging in flight in the failed world is dropped with it (ranks
// that merged it before the failure keep it); the survivors' average at the next state agreement
// makes the replicas equal either way.
// When no member of a generation holds a training state (every node that trained is gone, only
// joiners are left), the job cannot go on from a live peer and keeps no checkpoint: every worker
// exits comm::launcher::kExitWillRepeat (78) naming the generation.
// The LR schedule continues by step. The run ends after the step count planned in generation 0
// (--epochs x batches per rank then, capped by --max-steps) or when the epochs are done.
//
// Level options: the top level's outer anchor and momentum continue across generations (every
// rank takes the source rank's at each state agreement; a world level is the same level on any
// number of ranks), and each rank keeps its own error-feedback residual when no averaging of
// that level was pending as it left (joiners start at zero); lower levels start afresh
// (docs/elastic.md, "Level options under churn").
// Not supported in an elastic run (refused with a message naming the flag): --checkpoint-dir
// (the live peers hold the state) and --eval-every.
//
// Usage (a training program; train_mlp and train_resnet do this):
//   #include "comm/elastic/elastic_world.h"
//   apps::TrainingFlags training;   // parsed by add_training_flags (training_flags.h)
//   apps::ParallelFlags parallel;   // parsed by add_parallel_flags (parallel_training.h)
//   if (comm::elastic::ElasticWorldOptions::enabled_in_env()) {  // hsgd-run --nnodes MIN:MAX
//     return apps::train_elastic(
//         training, parallel,
//         {.program = "my_trainer",
//          .model = model,
//          .optimizer = apps::make_optimizer(training, model->parameters()),
//          .train = dataset,
//          .test = dataset.get(),
//          .loader = {.batch_size = 64, .shuffle = true}});
//   }

#include <memory>
#include <string>
#include <vector>

#include "apps/common/parallel_training.h"
#include "apps/common/training_flags.h"
#include "framework/data/data_loader.h"
#include "framework/data/dataset.h"
#include "framework/nn/module.h"
#include "framework/train/optimizer.h"

namespace hsgd::apps {

// What train_elastic trains; the model and optimizer persist across generations.
struct ElasticRun {
  std::string program;  // prefixes the report lines
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<Optimizer> optimizer;  // over model's parameters, not wrapped
  std::shared_ptr<const data::Dataset> train;
  const data::Dataset* test = nullptr;
  std::string checkpoint_dir{};           // --checkpoint-dir: refused when set
  data::DataLoaderOptions loader{};       // rank and world_size are set per generation
  std::vector<Tensor> average_buffers{};  // averaged with the parameters (BatchNorm statistics)
};

// Trains as the file comment says; returns the exit code (0). Throws BadFlag for the flags an
// elastic run does not support, and the errors of a generation that cannot form.
int train_elastic(const TrainingFlags& flags, const ParallelFlags& parallel, ElasticRun run);

}  // namespace hsgd::apps
