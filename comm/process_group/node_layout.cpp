#include "comm/process_group/node_layout.h"

#include <map>
#include <span>

#include "comm/error.h"
#include "comm/format_ranks.h"
#include "comm/process_group/process_group.h"

namespace hsgd::comm {

using hsgd::detail::format_ranks;

int NodeLayout::uniform_local_world_size() const {
  for (int size : local_world_sizes) {
    if (size != local_world_sizes.front()) return -1;
  }
  return local_world_sizes.empty() ? 0 : local_world_sizes.front();
}

std::vector<std::vector<int>> NodeLayout::nodes() const {
  const int n = static_cast<int>(node_ranks.size());
  std::vector<int> declared, undeclared;
  for (int r = 0; r < n; ++r)
    (node_ranks[static_cast<size_t>(r)] >= 0 ? declared : undeclared).push_back(r);
  HSGD_CHECK(declared.empty() || undeclared.empty(), "node layout of group '", group_name,
             "': ranks ", format_ranks(undeclared),
             " declared no node rank (GROUP_RANK) but ranks ", format_ranks(declared), " did");

  if (declared.empty()) {
    // Not told which node a rank is on: contiguous groups of LOCAL_WORLD_SIZE, as torch assumes.
    const int size = uniform_local_world_size();
    HSGD_CHECK(size >= 0, "node layout of group '", group_name,
               "': the ranks declared different LOCAL_WORLD_SIZEs ",
               format_ranks(local_world_sizes),
               " but no node rank (GROUP_RANK), so their nodes cannot be told apart; expected "
               "GROUP_RANK on every rank (hsgd-run sets it), or one LOCAL_WORLD_SIZE");
    const int per_node = size > 0 ? size : n;
    HSGD_CHECK(n % per_node == 0, "node layout of group '", group_name, "': LOCAL_WORLD_SIZE ",
               per_node, " must divide the size ", n,
               " of the group when no rank declares its node rank (GROUP_RANK)");
    std::vector<std::vector<int>> lists(static_cast<size_t>(n / per_node));
    for (int r = 0; r < n; ++r) lists[static_cast<size_t>(r / per_node)].push_back(r);
    return lists;
  }

  std::map<int, std::vector<int>> by_node;  // ordered by node rank
  for (int r = 0; r < n; ++r) by_node[node_ranks[static_cast<size_t>(r)]].push_back(r);
  std::vector<std::vector<int>> lists;
  for (auto& [node, members] : by_node) {
    const int declared_size = local_world_sizes[static_cast<size_t>(members.front())];
    for (int r : members) {
      HSGD_CHECK(local_world_sizes[static_cast<size_t>(r)] == declared_size,
                 "node layout of group '", group_name, "': ranks ", members.front(), " and ", r,
                 " of node ", node, " declared LOCAL_WORLD_SIZE ", declared_size, " and ",
                 local_world_sizes[static_cast<size_t>(r)], "; expected the same on one node");
    }
    // A subgroup may hold only some ranks of a node, never more than the node runs.
    HSGD_CHECK(declared_size == 0 || static_cast<int>(members.size()) <= declared_size,
               "node layout of group '", group_name, "': node ", node, " has ", members.size(),
               " members ", format_ranks(members), " but they declared LOCAL_WORLD_SIZE ",
               declared_size, "; expected at most that many ranks per node (is GROUP_RANK right?)");
    lists.push_back(std::move(members));
  }
  return lists;
}

NodeLayout gather_node_layout(ProcessGroup& pg) {
  const std::vector<int64_t> mine{pg.node_rank(), pg.local_world_size()};
  std::vector<int64_t> all(2 * static_cast<size_t>(pg.size()));
  pg.allgather(std::span<const int64_t>(mine), std::span<int64_t>(all), "node layout")
      ->wait(pg.work_timeout());
  NodeLayout layout;
  layout.group_name = pg.name();
  for (int r = 0; r < pg.size(); ++r) {
    layout.node_ranks.push_back(static_cast<int>(all[2 * static_cast<size_t>(r)]));
    layout.local_world_sizes.push_back(static_cast<int>(all[2 * static_cast<size_t>(r) + 1]));
  }
  return layout;
}

}  // namespace hsgd::comm
