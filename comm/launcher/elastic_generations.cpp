#include "comm/launcher/elastic_generations.h"

#include <algorithm>

#include "comm/error.h"

namespace hsgd::comm::launcher {

using elastic::Generation;
using elastic::MemberNode;

GenerationPlanner::GenerationPlanner(int min_nodes, int max_nodes,
                                     std::chrono::milliseconds last_call)
    : min_nodes_(min_nodes), max_nodes_(max_nodes), last_call_(last_call) {
  HSGD_CHECK(min_nodes >= 1 && min_nodes <= max_nodes, "GenerationPlanner: node range ", min_nodes,
             ":", max_nodes, " must satisfy 1 <= min <= max");
  HSGD_CHECK(last_call.count() >= 0, "GenerationPlanner: last call ", last_call.count(),
             " ms must not be negative");
}

std::vector<MemberNode> GenerationPlanner::desired(const Generation& latest,
                                                   const std::vector<MemberNode>& alive) const {
  auto is_alive = [&](const MemberNode& node) {
    return std::find(alive.begin(), alive.end(), node) != alive.end();
  };
  std::vector<MemberNode> out;
  for (const MemberNode& node : latest.nodes) {
    if (is_alive(node)) out.push_back(node);
  }
  for (const MemberNode& node : alive) {
    if (static_cast<int>(out.size()) >= max_nodes_) break;
    if (latest.node_rank(node.id) < 0) out.push_back(node);
  }
  return out;
}

std::optional<Generation> GenerationPlanner::plan(Clock::time_point now,
                                                  const std::optional<Generation>& latest,
                                                  const std::vector<MemberNode>& alive) {
  const int count = static_cast<int>(alive.size());
  if (!latest) {
    // Rule 1.
    if (count < min_nodes_) {
      last_call_end_.reset();
      return std::nullopt;
    }
    if (!last_call_end_) last_call_end_ = now + last_call_;
    if (count < max_nodes_ && now < *last_call_end_) return std::nullopt;
    Generation first{.number = 0};
    first.nodes.assign(alive.begin(), alive.begin() + std::min(count, max_nodes_));
    return first;
  }
  // Rule 2.
  std::vector<MemberNode> nodes = desired(*latest, alive);
  if (nodes == latest->nodes || static_cast<int>(nodes.size()) < min_nodes_) return std::nullopt;
  return Generation{.number = latest->number + 1, .nodes = std::move(nodes)};
}

}  // namespace hsgd::comm::launcher
