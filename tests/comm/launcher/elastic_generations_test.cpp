#include "comm/launcher/elastic_generations.h"

#include <gtest/gtest.h>

#include "comm/error.h"

namespace hsgd::comm::launcher {
namespace {

using elastic::Generation;
using elastic::MemberNode;
using std::chrono::milliseconds;
using Clock = GenerationPlanner::Clock;

MemberNode node(const std::string& id) { return MemberNode{.id = id, .host = id.substr(0, 1)}; }

std::string ids(const std::optional<Generation>& g) {
  if (!g) return "none";
  std::string out = std::to_string(g->number) + ":";
  for (const auto& n : g->nodes) out += " " + n.id;
  return out;
}

// Time is passed in: these tests never sleep.
TEST(GenerationPlannerTest, FirstGeneration_WaitsTheLastCallOnceMinAreAlive) {
  GenerationPlanner planner(2, 4, milliseconds(1000));
  const auto t = Clock::now();
  EXPECT_EQ(ids(planner.plan(t, std::nullopt, {node("a0")})), "none") << "below MIN";
  EXPECT_EQ(ids(planner.plan(t + milliseconds(5000), std::nullopt, {node("a0")})), "none");
  const std::vector<MemberNode> two = {node("a0"), node("b0")};
  EXPECT_EQ(ids(planner.plan(t + milliseconds(6000), std::nullopt, two)), "none")
      << "the last call starts when MIN are alive";
  EXPECT_EQ(ids(planner.plan(t + milliseconds(6900), std::nullopt, two)), "none");
  EXPECT_EQ(ids(planner.plan(t + milliseconds(7001), std::nullopt, two)), "0: a0 b0");
}

TEST(GenerationPlannerTest, FirstGeneration_MaxAliveEndsTheLastCallAndCapsTheMembers) {
  GenerationPlanner planner(1, 2, milliseconds(1000));
  const auto t = Clock::now();
  EXPECT_EQ(ids(planner.plan(t, std::nullopt, {node("a0"), node("b0"), node("c0")})), "0: a0 b0");
}

TEST(GenerationPlannerTest, FirstGeneration_FallingBelowMinRestartsTheLastCall) {
  GenerationPlanner planner(2, 4, milliseconds(1000));
  const auto t = Clock::now();
  const std::vector<MemberNode> two = {node("a0"), node("b0")};
  EXPECT_EQ(ids(planner.plan(t, std::nullopt, two)), "none");
  EXPECT_EQ(ids(planner.plan(t + milliseconds(500), std::nullopt, {node("a0")})), "none");
  EXPECT_EQ(ids(planner.plan(t + milliseconds(1200), std::nullopt, two)), "none");
  EXPECT_EQ(ids(planner.plan(t + milliseconds(2201), std::nullopt, two)), "0: a0 b0");
}

TEST(GenerationPlannerTest, Later_KeepsSurvivorsInOrderThenAddsJoinersUpToMax) {
  GenerationPlanner planner(1, 3, milliseconds(0));
  const auto t = Clock::now();
  const Generation g5{.number = 5, .nodes = {node("b0"), node("a0"), node("c0")}};
  EXPECT_EQ(ids(planner.plan(t, g5, {node("a0"), node("b0"), node("c0")})), "none") << "same";
  // c0 died, d0 and e0 joined (slot order d0, e0): b0 a0 keep their ranks, d0 takes the last.
  EXPECT_EQ(ids(planner.plan(t, g5, {node("a0"), node("b0"), node("d0"), node("e0")})),
            "6: b0 a0 d0");
  EXPECT_EQ(ids(planner.plan(t, g5, {node("a0")})), "6: a0");
}

TEST(GenerationPlannerTest, Later_NothingBelowMin) {
  GenerationPlanner planner(2, 3, milliseconds(0));
  const Generation g{.number = 1, .nodes = {node("a0"), node("b0")}};
  EXPECT_EQ(ids(planner.plan(Clock::now(), g, {node("a0")})), "none");
  EXPECT_EQ(ids(planner.plan(Clock::now(), g, {node("a0"), node("b1")})), "2: a0 b1");
}

TEST(GenerationPlannerTest, BadRange_Throws) {
  EXPECT_THROW(GenerationPlanner(0, 2, milliseconds(0)), InvalidArgument);
  EXPECT_THROW(GenerationPlanner(3, 2, milliseconds(0)), InvalidArgument);
}

}  // namespace
}  // namespace hsgd::comm::launcher
