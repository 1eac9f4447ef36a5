#pragma once
// GenerationPlanner: which generation an elastic agent proposes (comm/elastic/membership.h), from
// the newest generation in the store and the incarnations it finds alive. Pure: the agent reads
// the store and passes the time in, so every rule can be checked by hand.
//
// The rules (min, max: the job's node range):
//   1. Before generation 0: once at least `min` incarnations are alive, wait `last_call` (from the
//      first time this planner saw `min` of them) or until `max` are there, then propose
//      generation 0 = the alive incarnations in registration (slot) order, at most `max`. When
//      fewer than `min` are alive again, the last call starts over.
//   2. After: desired = the members of the newest generation still alive, in their order, then
//      the alive incarnations not in it, in slot order, while there are at most `max`. When
//      desired differs from the newest generation's members and has at least `min` nodes,
//      propose generation newest + 1 = desired.
//   Otherwise nothing is proposed. Several agents may plan the same number: the store keeps the
//   first proposal (propose_generation), and everyone plans again from it.
//
// Usage:
//   GenerationPlanner planner(/*min_nodes=*/1, /*max_nodes=*/4, std::chrono::seconds(2));
//   std::vector<elastic::MemberNode> alive = {{.id = "a-1-0", .host = "a"}};
//   auto proposal = planner.plan(GenerationPlanner::Clock::now(), std::nullopt, alive);
//   // nullopt until the last call is over (or 4 nodes are alive)

#include <chrono>
#include <optional>
#include <vector>

#include "comm/elastic/membership.h"

namespace hsgd::comm::launcher {

class GenerationPlanner {
 public:
  using Clock = std::chrono::steady_clock;

  // InvalidArgument unless 1 <= min_nodes <= max_nodes and last_call >= 0.
  GenerationPlanner(int min_nodes, int max_nodes, std::chrono::milliseconds last_call);

  // The generation to propose now, or nullopt. `alive` is in slot order.
  std::optional<elastic::Generation> plan(Clock::time_point now,
                                          const std::optional<elastic::Generation>& latest,
                                          const std::vector<elastic::MemberNode>& alive);

  // Rule 2's desired member list (not limited by min_nodes).
  std::vector<elastic::MemberNode> desired(const elastic::Generation& latest,
                                           const std::vector<elastic::MemberNode>& alive) const;

 private:
  // Constant after construction.
  const int min_nodes_;
  const int max_nodes_;
  const std::chrono::milliseconds last_call_;
  // When the last call before generation 0 ends, once min_nodes are alive.
  std::optional<Clock::time_point> last_call_end_;
};

}  // namespace hsgd::comm::launcher
