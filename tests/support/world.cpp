#include "tests/support/world.h"

#include <filesystem>
#include <numeric>

#include "comm/error.h"
#include "comm/store/file_store.h"
#include "tests/framework/distributed/dist_test_util.h"  // leave_together

namespace hsgd::testing {

RunResult run_world(int world_size, const WorldBody& body) {
  return run_world(world_size, WorldOptions{}, body);
}

RunResult run_world(int world_size, const WorldOptions& options, const WorldBody& body) {
  if (!options.node_sizes.empty()) {
    const int total = std::accumulate(options.node_sizes.begin(), options.node_sizes.end(), 0);
    HSGD_CHECK(total == world_size, "run_world: node_sizes sum to ", total,
               ", expected the world size ", world_size);
  }
  const std::filesystem::path dir = unique_temp_dir("world");
  RunResult result = run_ranks(world_size, RunOptions{.timeout = options.deadline}, [&](int rank) {
    comm::InitOptions init;
    init.rank = rank;
    init.world_size = world_size;
    init.store = std::make_shared<comm::FileStore>(dir);
    init.token = options.token;
    init.insecure = options.insecure;
    init.timeout = options.timeout;
    init.shared_memory = options.shared_memory;
    init.local_world_size = options.local_world_size;
    for (int node = 0, first = 0; node < static_cast<int>(options.node_sizes.size()); ++node) {
      const int size = options.node_sizes[static_cast<size_t>(node)];
      if (rank >= first && rank < first + size) {
        init.node_rank = node;
        init.local_world_size = size;
        init.local_rank = rank - first;
      }
      first += size;
    }
    const std::shared_ptr<comm::ProcessGroup> world = comm::init_process_group(init);
    body(rank, world);
    if (!::testing::Test::HasFatalFailure()) leave_together(*world);
  });
  std::filesystem::remove_all(dir);
  return result;
}

}  // namespace hsgd::testing
