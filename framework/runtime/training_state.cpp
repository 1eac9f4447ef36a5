#include "framework/runtime/training_state.h"

#include <algorithm>

#include "comm/error.h"
#include "framework/checkpoint/module_state.h"

namespace hsgd::runtime {

void TrainingState::add_module(const std::string& name, std::shared_ptr<nn::Module> module) {
  HSGD_CHECK(module != nullptr, "TrainingState::add_module: '", name, "' is null");
  remove(name);
  entries_.push_back({.name = name, .save = nullptr, .load = nullptr, .module = std::move(module)});
}

void TrainingState::add(const std::string& name, SaveFn save, LoadFn load) {
  HSGD_CHECK(!name.empty() && name.find('.') == std::string::npos, "TrainingState::add: name '",
             name, "' must be non-empty and contain no '.'");
  HSGD_CHECK(save && load, "TrainingState::add: '", name, "' needs a save and a load function");
  remove(name);
  entries_.push_back(
      {.name = name, .save = std::move(save), .load = std::move(load), .module = nullptr});
}

void TrainingState::add_generator(const std::string& name, Generator& generator) {
  add(
      name, [&generator] { return checkpoint::generator_state(generator); },
      [&generator](const StateDict& state) { checkpoint::load_generator_state(generator, state); });
}

void TrainingState::remove(const std::string& name) {
  std::erase_if(entries_, [&name](const Entry& e) { return e.name == name; });
}

void TrainingState::register_with(checkpoint::Checkpointer& checkpointer) const {
  for (const Entry& e : entries_) {
    if (e.module) {
      checkpointer.add_module(e.name, e.module);
    } else {
      checkpointer.add(e.name, e.save, e.load);
    }
  }
}

StateDict TrainingState::state_dict() const {
  StateDict out;
  for (const Entry& e : entries_) {
    out.merge(e.name + ".", e.module ? checkpoint::module_state(*e.module) : e.save());
  }
  return out;
}

void TrainingState::load_state_dict(const StateDict& state) const {
  std::vector<StateDict> parts;
  for (const Entry& e : entries_) {
    parts.push_back(state.with_prefix(e.name + "."));
    HSGD_CHECK_AS(InvalidArgument, parts.back().size() > 0, "TrainingState: the state has no '",
                  e.name, "' entries");
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (e.module) {
      checkpoint::load_module_state(*e.module, e.name, parts[i]);
    } else {
      e.load(parts[i]);
    }
  }
}

}  // namespace hsgd::runtime
