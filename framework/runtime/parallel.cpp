#include "framework/runtime/parallel.h"

#include "comm/error.h"
#include "comm/log.h"
#include "comm/process_group/subgroups.h"
#include "framework/distributed/model_averaging/hierarchical_model_averager.h"

namespace hsgd::runtime {

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::kDDP:
      return "ddp";
    case Mode::kLocalSGD:
      return "local-sgd";
    case Mode::kHierarchical:
      return "hierarchical";
  }
  return "?";
}

std::string check(const ParallelOptions& options) {
  if (options.warmup_steps < 0) {
    return str_cat("warmup_steps ", options.warmup_steps, " must be at least 0");
  }
  if (options.subgroup_size < 0) {
    return str_cat("subgroup_size ", options.subgroup_size,
                   " must be at least 0 (0: the ranks of this node)");
  }
  if (options.emulated_node_size < 0) {
    return str_cat("emulated_node_size ", options.emulated_node_size,
                   " must be at least 1, or 0 for the nodes as launched");
  }
  const size_t levels = options.levels.size();
  switch (options.mode) {
    case Mode::kDDP:
      if (levels != 0) {
        return str_cat("mode ddp averages gradients only: it takes no averaging levels (got ",
                       levels, ")");
      }
      if (options.emulated_node_size != 0) {
        return str_cat(
            "mode ddp averages gradients over the whole world at every step, so "
            "emulated_node_size ",
            options.emulated_node_size,
            " would change nothing; emulate nodes with mode local-sgd or hierarchical");
      }
      break;
    case Mode::kLocalSGD:
      if (levels != 1) {
        return str_cat("mode local-sgd takes one averaging level (got ", levels, ")");
      }
      if (options.levels[0].period < 1) {
        return str_cat("mode local-sgd: period ", options.levels[0].period, " must be at least 1");
      }
      break;
    case Mode::kHierarchical:
      if (levels == 0) return "mode hierarchical needs at least one averaging level";
      break;
  }
  return "";
}

Parallel make_parallel(const std::shared_ptr<nn::Module>& model,
                       const std::shared_ptr<comm::ProcessGroup>& world,
                       const ParallelOptions& options, std::vector<Tensor> average_buffers) {
  const std::string problem = check(options);
  HSGD_CHECK_AS(InvalidArgument, problem.empty(), "make_parallel: ", problem);
  const int world_size = world->size();
  Parallel out;
  if (world_size > 1 || options.mode != Mode::kDDP) {
    out.ddp = std::make_unique<distributed::DistributedDataParallel>(model, world);
  }
  if (options.mode == Mode::kDDP) return out;

  const int node_size = options.emulated_node_size;
  if (node_size > 0 && world_size % node_size != 0) {
    throw ParallelMismatch(
        str_cat("emulated_node_size ", node_size, " must divide the world size ", world_size,
                " (each block of ", node_size, " contiguous ranks plays one node)"),
        world_size, "emulated_node_size");
  }
  auto state = std::make_shared<distributed::PostLocalSGDState>(distributed::PostLocalSGDState{
      .process_group = world, .start_localSGD_iter = options.warmup_steps});
  // The post-local gradient group: subgroup_size, else an emulated node, else the real node.
  const int gradient_group = options.subgroup_size > 0 ? options.subgroup_size : node_size;
  if (gradient_group == 1) {
    state->post_local_gradient_allreduce = false;
  } else if (gradient_group > 1) {
    if (world_size % gradient_group != 0) {
      throw ParallelMismatch(
          str_cat("subgroup_size ", gradient_group, " must divide the world size ", world_size),
          world_size, "subgroup_size");
    }
    state->subgroup = comm::new_subgroups(world, gradient_group).first;
  }
  out.ddp->register_comm_hook(state, distributed::post_localSGD_hook);
  out.hook_state = state;
  if (world_size > 1 && state->post_local_gradient_allreduce &&
      state->subgroup->size() == world_size && world->rank() == 0) {
    const std::string why =
        options.subgroup_size > 0 ? str_cat("subgroup_size ", options.subgroup_size)
        : node_size > 0           ? str_cat("emulated_node_size ", node_size)
                                  : std::string("the ranks of the node, which holds all of them");
    comm::logger()->warn(
        "post-local SGD over {} ranks: after the warm-up, gradients are still averaged over all "
        "{} ranks ({}), so the replicas stay identical and model averaging changes nothing; to "
        "try averaging on one machine, emulate nodes (ParallelOptions::emulated_node_size, "
        "--emulated-node-size in the examples) or average no gradients (subgroup_size 1)",
        world_size, world_size, why);
  }
  // 'node' levels on emulated nodes: the contiguous level of the emulated node's size.
  std::vector<distributed::LevelOptions> levels = options.levels;
  if (node_size > 0) {
    for (distributed::LevelOptions& level : levels) {
      if (level.group_size == distributed::kNodeGroup) level.group_size = node_size;
    }
  }
  const distributed::ModelAveragerOptions averager_options{.average_buffers =
                                                               std::move(average_buffers)};
  try {
    if (options.mode == Mode::kLocalSGD) {
      out.averager = std::make_shared<distributed::PeriodicModelAverager>(
          levels.front(), options.warmup_steps, world, averager_options);
    } else {
      out.averager = std::make_shared<distributed::HierarchicalModelAverager>(
          levels, options.warmup_steps, world, averager_options);
    }
  } catch (const ParallelMismatch&) {
    throw;
  } catch (const InvalidArgument& e) {
    throw ParallelMismatch(e.what(), world_size);
  }
  return out;
}

}  // namespace hsgd::runtime
