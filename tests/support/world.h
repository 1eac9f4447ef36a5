#pragma once
// run_world: the skeleton of every multi-rank test over a world group, so that a test reads as
// its assertions. It runs body(rank, world) on world_size ranks, each a separate process
// (run_ranks, tests/support/multiprocess.h), where world is a ProcessGroup of all ranks that met
// through a FileStore in a fresh temporary directory (removed afterwards). When body returns,
// the rank meets the others through the store (leave_together) before its process exits, so
// that no rank closes its connections while a peer still reads its last collective. A rank
// whose body threw or hit a fatal assertion does not wait: the others then fail at their next
// collective instead of hanging, within WorldOptions::timeout.
//
// Usage:
//   auto result = hsgd::testing::run_world(4, [&](int rank, const auto& world) {
//     std::vector<float> x{static_cast<float>(rank)};
//     world->allreduce(std::span<float>(x))->wait();
//     EXPECT_EQ(x[0], 6.0f);
//   });
//   EXPECT_RANKS_OK(result);

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group/process_group.h"
#include "tests/support/multiprocess.h"

namespace hsgd::testing {

struct WorldOptions {
  // Deadline of the whole run (every rank is killed after it); ctest's TIMEOUT is the outer bound.
  std::chrono::milliseconds deadline = std::chrono::seconds(60);
  // InitOptions::timeout: init and every collective, so a broken test fails rather than waits
  // for the deadline.
  std::chrono::milliseconds timeout = std::chrono::seconds(20);
  // InitOptions::shared_memory (allreduce within the node over shared memory, or Gloo's TCP).
  bool shared_memory = true;
  // InitOptions::local_world_size: ranks per emulated node (contiguous), 0: not declared.
  int local_world_size = 0;
  // Uneven emulated nodes, as hsgd-run lays them out: node i runs node_sizes[i] contiguous ranks
  // ({3, 1}: ranks 0-2 on node 0, rank 3 on node 1), each rank declaring its node
  // (InitOptions::node_rank) and its node's size as local_world_size. The sizes must sum to the
  // world size. Empty: only local_world_size is declared (no node ranks).
  std::vector<int> node_sizes = {};
  // InitOptions::token and ::insecure: the ranks talk over TLS keyed by the token (the default,
  // as in every real job), or over plain TCP when insecure.
  std::string token = "run-world-test-token";
  bool insecure = false;
};

using WorldBody = std::function<void(int rank, const std::shared_ptr<comm::ProcessGroup>& world)>;

RunResult run_world(int world_size, const WorldOptions& options, const WorldBody& body);
RunResult run_world(int world_size, const WorldBody& body);  // default WorldOptions

// A gtest parameter name for a node layout, e.g. "Nodes_3_1" for {3, 1}.
inline std::string node_layout_name(const std::vector<int>& sizes) {
  std::string name = "Nodes";
  for (int size : sizes) {
    name += '_';  // not "_" + to_string: GCC 12 warns falsely (-Wrestrict)
    name += std::to_string(size);
  }
  return name;
}

}  // namespace hsgd::testing
