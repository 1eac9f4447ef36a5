#include "comm/elastic/membership.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "comm/error.h"
#include "comm/store/hash_store.h"

namespace hsgd::comm::elastic {
namespace {

Generation two_nodes(int64_t number) {
  return Generation{.number = number,
                    .nodes = {{.id = "a-17-0", .host = "a", .local_world_size = 2},
                              {.id = "b-9-1", .host = "b", .local_world_size = 3}}};
}

TEST(MembershipTest, Generation_EncodeDecodeRoundTrip) {
  const Generation g = two_nodes(7);
  const Generation back = Generation::decode(g.encode());
  EXPECT_EQ(back, g);
  EXPECT_EQ(back.world_size(), 5);
  EXPECT_EQ(back.node_rank("b-9-1"), 1);
  EXPECT_EQ(back.rank_offset("b-9-1"), 2);
  EXPECT_EQ(back.rank_offset("c-1-0"), -1);
  EXPECT_EQ(back.describe(), "a-17-0(a,2) b-9-1(b,3)");
  const Generation empty{.number = 0};
  EXPECT_EQ(Generation::decode(empty.encode()), empty);
}

TEST(MembershipTest, Generation_GarbageIsRejected) {
  for (const char* text :
       {"", "gen 1\n", "generation x\n", "generation -1\n", "generation 1\na-1-0 a\n",
        "generation 1\na-1-0 a two\n", "generation 1\na-1-0 a 0\n", "hello world"}) {
    EXPECT_THROW(Generation::decode(text), CommError) << "'" << text << "'";
  }
  Generation spaced = two_nodes(0);
  spaced.nodes[0].host = "a b";
  EXPECT_THROW(spaced.encode(), CommError);
}

TEST(MembershipTest, ConcurrentProposalsForOneNumber_BothAdoptTheSameWinner) {
  for (int round = 0; round < 20; ++round) {
    HashStore store;
    Generation mine = two_nodes(0);
    Generation theirs = two_nodes(0);
    theirs.nodes.pop_back();
    Generation got_mine, got_theirs;
    std::thread t1([&] { got_mine = propose_generation(store, mine); });
    std::thread t2([&] { got_theirs = propose_generation(store, theirs); });
    t1.join();
    t2.join();
    EXPECT_EQ(got_mine, got_theirs) << "round " << round;
    EXPECT_TRUE(got_mine == mine || got_mine == theirs) << "round " << round;
    ASSERT_TRUE(read_latest_generation(store).has_value());
    EXPECT_EQ(*read_latest_generation(store), got_mine) << "round " << round;
  }
}

TEST(MembershipTest, Latest_NeverMovesBack) {
  HashStore store;
  EXPECT_FALSE(read_latest_generation(store).has_value());
  propose_generation(store, two_nodes(0));
  propose_generation(store, two_nodes(1));
  // A slow agent proposing generation 0 again adopts the stored one and leaves latest at 1.
  Generation late = two_nodes(0);
  late.nodes.pop_back();
  EXPECT_EQ(propose_generation(store, late), two_nodes(0));
  EXPECT_EQ(to_string(store.get(kLatestKey)), "1");
  EXPECT_EQ(read_latest_generation(store)->number, 1);
}

TEST(MembershipTest, ReadLatest_FollowsGenerationsNotAnnouncedYet) {
  HashStore store;
  propose_generation(store, two_nodes(0));
  // A writer between gen/<2> and latest: readers see generation 2 already.
  store.set(generation_key(1), to_bytes(two_nodes(1).encode()));
  store.set(generation_key(2), to_bytes(two_nodes(2).encode()));
  EXPECT_EQ(read_latest_generation(store)->number, 2);
}

TEST(MembershipTest, Registrations_InSlotOrderWithLeft) {
  HashStore store;
  EXPECT_TRUE(read_registrations(store).empty());
  const MemberNode a{.id = "a-1-0", .host = "a", .local_world_size = 2};
  const MemberNode b{.id = "b-2-0", .host = "b", .local_world_size = 1};
  const MemberNode b1{.id = "b-2-1", .host = "b", .local_world_size = 1};
  EXPECT_EQ(register_node(store, a), 0);
  EXPECT_EQ(register_node(store, b), 1);
  store.set(left_key(b.id), to_bytes("left"));
  EXPECT_EQ(register_node(store, b1), 2);
  const auto regs = read_registrations(store);
  ASSERT_EQ(regs.size(), 3u);
  EXPECT_EQ(regs[0].node, a);
  EXPECT_FALSE(regs[0].left);
  EXPECT_EQ(regs[1].node, b);
  EXPECT_TRUE(regs[1].left);
  EXPECT_EQ(regs[2].node, b1);
  EXPECT_FALSE(regs[2].left);
  EXPECT_THROW(register_node(store, MemberNode{.id = "c 1", .host = "c"}), CommError);
}

// A restarted rendezvous server gets the job back from the clients that are still alive: each
// re-publishes the keys it wrote and its share of the slots counter. Node b (slot 1) died before
// the restart, so the counter comes back as 3 while d still holds slot 3.
std::vector<MemberNode> republished_after_b_died(HashStore& store) {
  const std::vector<MemberNode> nodes = {{.id = "a-1-0", .host = "a"},
                                         {.id = "b-2-0", .host = "b"},
                                         {.id = "c-3-0", .host = "c"},
                                         {.id = "d-4-0", .host = "d"}};
  store.add(kSlotsKey, 3);
  for (const int slot : {0, 2, 3}) {
    const MemberNode& n = nodes[static_cast<size_t>(slot)];
    store.set(alive_key(n.id), to_bytes("1"));
    store.set(node_key(n.id), to_bytes(n.host + " 1"));
    store.set(slot_key(slot), to_bytes(n.id));
  }
  return nodes;
}

std::vector<std::string> ids(const std::vector<Registration>& registrations) {
  std::vector<std::string> out;
  for (const Registration& r : registrations) out.push_back(r.node.id);
  return out;
}

TEST(MembershipTest, AfterServerRestart_ANewNodeNeverTakesALiveNodesSlot) {
  HashStore store;
  const std::vector<MemberNode> nodes = republished_after_b_died(store);
  // d is not listed until its agent raises the counter again.
  EXPECT_EQ(ids(read_registrations(store)), (std::vector<std::string>{"a-1-0", "c-3-0"}));
  const MemberNode b1{.id = "b-2-1", .host = "b"};
  const int64_t slot = register_node(store, b1);
  EXPECT_EQ(slot, 4) << "slot 3 is d's";
  EXPECT_EQ(keep_registration(store, nodes[3], 3), 3);
  EXPECT_EQ(keep_registration(store, nodes[0], 0), 0);
  EXPECT_EQ(keep_registration(store, b1, slot), slot);
  EXPECT_EQ(ids(read_registrations(store)),
            (std::vector<std::string>{"a-1-0", "c-3-0", "d-4-0", "b-2-1"}));
}

TEST(MembershipTest, AfterServerRestart_ANodeWhoseSlotWasRepublishedRegistersAgain) {
  HashStore store;
  const std::vector<MemberNode> nodes = republished_after_b_died(store);
  // The new incarnation registered before d re-published slot 3 (here: d's slot is taken back).
  store.delete_key(slot_key(3));
  const MemberNode b1{.id = "b-2-1", .host = "b"};
  EXPECT_EQ(register_node(store, b1), 3);
  store.set(slot_key(3), to_bytes(nodes[3].id));  // d re-publishes
  EXPECT_EQ(keep_registration(store, nodes[3], 3), 3);
  const int64_t again = keep_registration(store, b1, 3);
  EXPECT_GT(again, 3);
  EXPECT_EQ(ids(read_registrations(store)),
            (std::vector<std::string>{"a-1-0", "c-3-0", "d-4-0", "b-2-1"}));
}

}  // namespace
}  // namespace hsgd::comm::elastic
