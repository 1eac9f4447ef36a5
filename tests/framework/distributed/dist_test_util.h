#pragma once
// Helpers shared by the distributed suites (DDP, hooks, averagers, PostLocalSGDOptimizer).

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group/process_group.h"
#include "comm/store/file_store.h"
#include "comm/store/store_barrier.h"
#include "comm/transport/tls_device.h"
#include "framework/tensor/tensor.h"

namespace hsgd::testing {

// Call at the end of a rank's body: returns once every rank of pg finished its collectives.
// A process that exits while a peer still reads its last collective can reset the connection
// (the peer then fails with "Connection closed by peer"); waiting through the store, not a
// collective, avoids that race.
// Throws hsgd::Timeout naming the ranks that did not arrive within 30 s.
inline void leave_together(const comm::ProcessGroup& pg) {
  comm::store_barrier(*pg.store(), pg.key_prefix() + "test-done/", pg.rank(), pg.size(),
                      std::chrono::seconds(30));
}

// A group of the same ranks as a world, on a TLS device of its own: bytes_sent() is what this
// rank wrote to its connections and to those of every group made from it (new_group,
// subgroups), shared memory and the store excepted. A delta around a call is what the call sent.
struct CountedGroup {
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<comm::ProcessGroup> pg;

  uint64_t bytes_sent() const { return comm::transport::tls_bytes_written(*device).value(); }
};

// Collective over world (every rank calls it with the same name). The node layout the world's
// ranks declared is kept, so that shared memory and node leaders work as in the world.
inline CountedGroup counted_group(const comm::ProcessGroup& world, const std::string& name) {
  CountedGroup out;
  out.device = comm::transport::create_tls_device(
      {.host = "127.0.0.1", .job_id = "counted", .token = "counted-group-test-token"});
  comm::ProcessGroup::Options options;
  options.store = world.store();
  options.key_prefix = world.key_prefix() + name + "/";
  options.name = name;
  options.rank = world.rank();
  options.ranks = world.ranks();
  options.timeout = world.timeout();
  options.device = out.device;
  options.local_world_size = world.local_world_size();
  options.node_rank = world.node_rank();
  out.pg = std::make_shared<comm::ProcessGroup>(std::move(options));
  return out;
}

// Every element of t equals expected (exactly: the values are sums of small integers divided
// by a power of two or averaged the same way on every rank); prints index, expected, actual.
inline void expect_all_equal(const Tensor& t, float expected, const std::string& what) {
  const std::vector<float> v = t.to_vector();
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_FLOAT_EQ(v[i], expected) << what << " element " << i;
  }
}

}  // namespace hsgd::testing
