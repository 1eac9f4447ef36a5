#include "comm/process_group/detail/child_group.h"

#include <algorithm>

namespace hsgd::detail {

comm::ProcessGroup::Options child_options(const comm::ProcessGroup::Options& parent,
                                          const std::string& suffix, int rank,
                                          std::vector<int> global_ranks) {
  comm::ProcessGroup::Options child = parent;
  child.key_prefix = parent.key_prefix + suffix + "/";
  child.name = parent.name + "/" + suffix;
  child.rank = rank;
  child.ranks = std::move(global_ranks);
  return child;
}

std::shared_ptr<comm::ProcessGroup> make_child_group(
    const std::shared_ptr<comm::ProcessGroup>& parent, std::vector<int> parent_ranks) {
  const int64_t id = parent->next_child_id_++;
  std::sort(parent_ranks.begin(), parent_ranks.end());
  auto it = std::find(parent_ranks.begin(), parent_ranks.end(), parent->rank());
  if (it == parent_ranks.end()) return nullptr;
  HSGD_CHECK_AS(CommError, !parent->aborted_.load(), "group '", parent->name(),
                "' was aborted (ProcessGroup::abort): no group can be made from it");
  std::vector<int> global_ranks;
  for (int r : parent_ranks) global_ranks.push_back(parent->ranks()[static_cast<size_t>(r)]);
  std::string suffix = "g";  // not "g" + to_string(id): GCC 12 warns falsely (-Wrestrict)
  suffix += std::to_string(id);
  auto child = std::make_shared<comm::ProcessGroup>(
      child_options(parent->options_, suffix, static_cast<int>(it - parent_ranks.begin()),
                    std::move(global_ranks)));
  {
    std::lock_guard<std::mutex> lock(parent->children_mu_);
    std::erase_if(parent->children_, [](const auto& c) { return c.expired(); });
    parent->children_.push_back(child);
  }
  // A parent aborted while the child connected (e.g. by the elastic watcher) did not see it:
  // the groups made from an aborted group are aborted too. abort() sets the flag before it
  // reads children_, so one of the two reaches the child.
  if (parent->aborted_.load()) child->abort();
  return child;
}

}  // namespace hsgd::detail
