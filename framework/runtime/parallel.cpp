#include "framework/runtime/parallel.h"

#include "comm/error.h"
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
  const size_t levels = options.levels.size();
  switch (options.mode) {
    case Mode::kDDP:
      if (levels != 0) {
        return str_cat("mode ddp averages gradients only: it takes no averaging levels (got ",
                       levels, ")");
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

  auto state = std::make_shared<distributed::PostLocalSGDState>(distributed::PostLocalSGDState{
      .process_group = world, .start_localSGD_iter = options.warmup_steps});
  if (options.subgroup_size == 1) {
    state->post_local_gradient_allreduce = false;
  } else if (options.subgroup_size > 1) {
    if (world_size % options.subgroup_size != 0) {
      throw ParallelMismatch(str_cat("subgroup_size ", options.subgroup_size,
                                     " must divide the world size ", world_size),
                             world_size);
    }
    state->subgroup = comm::new_subgroups(world, options.subgroup_size).first;
  }
  out.ddp->register_comm_hook(state, distributed::post_localSGD_hook);
  out.hook_state = state;
  const distributed::ModelAveragerOptions averager_options{.average_buffers =
                                                               std::move(average_buffers)};
  try {
    if (options.mode == Mode::kLocalSGD) {
      out.averager = std::make_shared<distributed::PeriodicModelAverager>(
          options.levels.front(), options.warmup_steps, world, averager_options);
    } else {
      out.averager = std::make_shared<distributed::HierarchicalModelAverager>(
          options.levels, options.warmup_steps, world, averager_options);
    }
  } catch (const ParallelMismatch&) {
    throw;
  } catch (const InvalidArgument& e) {
    throw ParallelMismatch(e.what(), world_size);
  }
  return out;
}

}  // namespace hsgd::runtime
