#include "comm/launcher/node_rendezvous.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "comm/store/hash_store.h"

namespace hsgd::comm::launcher {
namespace {

using std::chrono::milliseconds;

NodeInfo node(const std::string& host, int nproc, int requested = -1) {
  return NodeInfo{.host = host, .pid = 100, .local_world_size = nproc, .requested_rank = requested};
}

NodeRendezvousOptions options(int nnodes, milliseconds timeout = milliseconds(5000)) {
  return NodeRendezvousOptions{.nnodes = nnodes,
                               .job_id = "job",
                               .endpoint = "127.0.0.1:1",
                               .key_prefix = "hsgd-run/attempt/0/",
                               .timeout = timeout,
                               .poll_interval = milliseconds(5)};
}

TEST(NodeRendezvousTest, NodeInfo_RoundTrips) {
  NodeInfo n{.host = "host-a", .pid = 42, .local_world_size = 8, .requested_rank = 3};
  NodeInfo back = NodeInfo::decode(n.encode());
  EXPECT_EQ(back.host, n.host);
  EXPECT_EQ(back.pid, n.pid);
  EXPECT_EQ(back.local_world_size, n.local_world_size);
  EXPECT_EQ(back.requested_rank, n.requested_rank);
  EXPECT_THROW(NodeInfo::decode("only-a-host"), CommError);
}

TEST(NodeRendezvousTest, AssignRanks_ArrivalOrderFillsFreeRanks) {
  // Arrival order a, b, c; b asked for rank 0, so a and c take 1 and 2 in arrival order.
  std::vector<NodeInfo> arrivals{node("a", 2), node("b", 3, 0), node("c", 1)};
  const int expected_rank[] = {1, 0, 2};
  const int expected_offset[] = {3, 0, 5};
  for (int slot = 0; slot < 3; ++slot) {
    NodeAssignment a = assign_node_ranks(arrivals, slot);
    EXPECT_EQ(a.node_rank, expected_rank[slot]) << "slot " << slot;
    EXPECT_EQ(a.rank_offset, expected_offset[slot]) << "slot " << slot;
    EXPECT_EQ(a.world_size, 6);
    ASSERT_EQ(a.nodes.size(), 3u);
    EXPECT_EQ(a.nodes[0].host, "b");
    EXPECT_EQ(a.nodes[1].host, "a");
    EXPECT_EQ(a.nodes[2].host, "c");
  }
}

TEST(NodeRendezvousTest, AssignRanks_RejectsConflictsAndRangeErrors) {
  try {
    assign_node_ranks({node("a", 1, 1), node("b", 1, 1)}, 0);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("both asked for AgentOptions::node_rank 1"),
              std::string::npos)
        << e.what();
  }
  try {
    assign_node_ranks({node("a", 1, 2), node("b", 1)}, 0);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("AgentOptions::node_rank 2"), std::string::npos)
        << e.what();
  }
}

TEST(NodeRendezvousTest, ThreeNodes_AgreeOnOneTable) {
  HashStore store;
  std::vector<std::future<NodeAssignment>> results;
  for (int i = 0; i < 3; ++i) {
    results.push_back(std::async(std::launch::async, [&store, i] {
      return rendezvous_nodes(store, options(3), node("h" + std::to_string(i), i + 1));
    }));
  }
  std::vector<NodeAssignment> got;
  for (auto& r : results) got.push_back(r.get());
  std::vector<bool> seen(3, false);
  for (const auto& a : got) {
    EXPECT_EQ(a.world_size, 6);
    ASSERT_GE(a.node_rank, 0);
    ASSERT_LT(a.node_rank, 3);
    EXPECT_FALSE(seen[a.node_rank]) << "node rank " << a.node_rank << " assigned twice";
    seen[a.node_rank] = true;
    EXPECT_EQ(a.table(), got[0].table());
    int offset = 0;
    for (int r = 0; r < a.node_rank; ++r) offset += a.nodes[r].local_world_size;
    EXPECT_EQ(a.rank_offset, offset);
  }
}

TEST(NodeRendezvousTest, MissingNode_TimesOutListingJoinedAndMissing) {
  HashStore store;
  try {
    rendezvous_nodes(store, options(3, milliseconds(200)), node("lonely-host", 2));
    FAIL() << "expected Timeout";
  } catch (const Timeout& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("1 of 3 nodes joined"), std::string::npos) << msg;
    EXPECT_NE(msg.find("lonely-host"), std::string::npos) << msg;
    EXPECT_NE(msg.find("2 missing"), std::string::npos) << msg;
    EXPECT_NE(msg.find("127.0.0.1:1"), std::string::npos) << msg;
  }
}

TEST(NodeRendezvousTest, ExtraNode_IsRejected) {
  HashStore store;
  auto first = std::async(std::launch::async,
                          [&] { return rendezvous_nodes(store, options(1), node("a", 1)); });
  EXPECT_EQ(first.get().node_rank, 0);
  try {
    rendezvous_nodes(store, options(1), node("b", 1));
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("already has 1 nodes"), std::string::npos) << e.what();
  }
}

TEST(NodeRendezvousTest, Interrupted_StopsWaiting) {
  HashStore store;
  auto opts = options(2);
  opts.interrupted = [] { return true; };
  EXPECT_THROW(rendezvous_nodes(store, opts, node("a", 1)), RendezvousInterrupted);
}

}  // namespace
}  // namespace hsgd::comm::launcher
