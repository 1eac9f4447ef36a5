// Leaving a generation and what crosses to the next one (runtime.h): the top level's anchor,
// outer momentum and error-feedback residual, and the membership change reported.

#include <array>
#include <span>
#include <variant>

#include "comm/process_group/work.h"
#include "framework/runtime/detail/loop.h"
#include "framework/runtime/detail/state_transfer.h"

namespace hsgd::runtime::detail {
namespace {

// The level's description with a group of the whole world spelled as kWholeGroup: a level over
// the whole world is the same level on any number of ranks (its anchor is the world's last
// common point), while a level over part of the world keeps its size (8:4 on 8 ranks is not the
// 8:4 that spanned a world of 4).
std::string carry_key(distributed::LevelOptions level, int world_size) {
  if (level.group_size == world_size) level.group_size = distributed::kWholeGroup;
  return distributed::describe(level);
}

// A key of a level's state without its "levels.<i>." prefix: "anchor", or
// "fragments.<f>.anchor" for a fragmented level (whose fragments carry each their own state).
std::string level_key(const std::string& key) {
  return key.substr(key.find('.', std::string("levels.").size()) + 1);
}

// Whether some key of state ends with the entry `name` ("anchor": a level's or a fragment's).
bool has_entry(const StateDict& state, const std::string& name) {
  for (const auto& [key, value] : state.entries()) {
    if (key == name || key.ends_with("." + name)) return true;
  }
  return false;
}

}  // namespace

// Collective over the new world: a top level that keeps state (outer optimizer, compression)
// continues from the source's anchor and outer momentum (per fragment for a fragmented level), on
// every rank (a failure during an averaging may have left the survivors' anchors apart), when the
// source's previous top level was the same level; else it starts afresh (its first averaging is
// plain). With it, each rank keeps its own error-feedback residual when its previous top level was
// the same level and left one settled (no averaging pending there, see settled_level_state): the
// residual is the part of this rank's past contributions that rounding kept back, and adding it to
// the next averaging delivers it whatever the group (it is in units of the group's sum, so it
// enters the next mean divided by the new group size). A joiner has contributed nothing and starts
// at zero; so does a rank whose ring was interrupted. Lower levels always start afresh: their
// groups change with the membership.
void Loop::carry_top_level(int source) {
  comm::ProcessGroup& world = *world_;
  distributed::ModelAverager& averager = *parallel_.averager;
  const size_t top = averager.level_options().size() - 1;
  const distributed::LevelOptions& options = averager.level_options()[top];
  carried_.clear();
  if (!distributed::is_anchored(options)) return;
  // This rank's previous top level is the same level (its carried state applies).
  const bool same_level = top_carry_.level == carry_key(options, world.size());
  StateDict carry;
  if (world.rank() == source && same_level) {
    for (const auto& [key, value] : top_carry_.state.entries()) {
      const std::string name = key.substr(key.rfind('.') + 1);
      if (name == "anchor" || name == "outer_momentum") carry.set(level_key(key), value);
    }
  }
  carry = broadcast_state(world, source, replica_.step, carry, "the top level's state");
  if (!has_entry(carry, "anchor")) return;
  StateDict state;
  state.set("step", replica_.step);
  const std::string level = "levels." + std::to_string(top) + ".";
  for (const auto& [key, value] : carry.entries()) state.set(level + key, value);
  // {kept a residual, kept a non-zero one} on this rank.
  std::array<int64_t, 2> mine{0, 0};
  if (same_level) {
    for (const auto& [key, value] : top_carry_.state.entries()) {
      if (!key.ends_with(".residual")) continue;
      state.set(level + level_key(key), value);
      mine[0] = 1;
      for (const float e : std::get<Tensor>(value).to_vector()) {
        mine[1] |= static_cast<int64_t>(e != 0.0f);
      }
    }
  }
  averager.load_state_dict(state);
  std::vector<int64_t> all(2 * static_cast<size_t>(world.size()));
  world.allgather(std::span<const int64_t>(mine), std::span<int64_t>(all), "elastic residuals")
      ->wait();
  int64_t kept = 0;
  int64_t nonzero = 0;
  for (size_t r = 0; r < all.size(); r += 2) {
    kept += all[r];
    nonzero += all[r + 1];
  }
  carried_ =
      str_cat("; top level ", distributed::describe(options),
              has_entry(carry, "outer_momentum") ? ": anchor and outer momentum" : ": anchor",
              " from rank ", source);
  if (options.error_feedback) {
    carried_ += str_cat(", error-feedback residuals kept on ", kept, " of ", world.size(),
                        " ranks (non-zero on ", nonzero, ")");
  }
}

int Loop::lost_worker_count() const {
  int lost = 0;
  for (const auto& node : previous_.nodes) {
    if (elastic_world_->generation().node_rank(node.id) < 0) lost += node.local_world_size;
  }
  return lost;
}

std::string Loop::generation_change() const {
  std::vector<std::string> changes;
  const comm::elastic::Generation& now = elastic_world_->generation();
  for (const auto& node : previous_.nodes) {
    if (now.node_rank(node.id) < 0)
      changes.push_back("lost node " + node.host + " (" + node.id + ")");
  }
  for (const auto& node : now.nodes) {
    if (previous_.number >= 0 && previous_.node_rank(node.id) < 0) {
      changes.push_back("joined node " + node.host + " (" + node.id + ")");
    }
  }
  std::string out;
  for (const std::string& c : changes) out += (out.empty() ? "" : "; ") + c;
  return out;
}

void Loop::leave_generation() {
  // A generation whose top level keeps no state (on fewer ranks the world level may be dropped)
  // leaves the last one that did: the anchor is the world's last common point, and the progress
  // since is the next pseudo-gradient.
  if (parallel_.averager && distributed::is_anchored(parallel_.averager->level_options().back())) {
    const auto& levels = parallel_.averager->level_options();
    top_carry_ = TopLevelCarry{
        .level = carry_key(levels.back(), parallel_.averager->process_group()->size()),
        .state = parallel_.averager->settled_level_state(levels.size() - 1)};
  }
  preemption_.reset();
  if (checkpointer_ && world_ && world_->failed()) {
    // A write of the failed world may wait for a lost rank's report (up to its timeout): the
    // survivors go on, and the write ends (or gives up, leaving no manifest) meanwhile.
    retired_.emplace_back([c = std::move(checkpointer_)]() mutable { c.reset(); });
  }
  checkpointer_.reset();
  batch_.reset();
  loader_.reset();
  parallel_ = Parallel{};
  if (elastic_world_) elastic_world_->abandon();
  world_.reset();
}

}  // namespace hsgd::runtime::detail
