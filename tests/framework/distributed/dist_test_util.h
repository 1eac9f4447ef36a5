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

// Every element of t equals expected (exactly: the values are sums of small integers divided
// by a power of two or averaged the same way on every rank); prints index, expected, actual.
inline void expect_all_equal(const Tensor& t, float expected, const std::string& what) {
  const std::vector<float> v = t.to_vector();
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_FLOAT_EQ(v[i], expected) << what << " element " << i;
  }
}

}  // namespace hsgd::testing
