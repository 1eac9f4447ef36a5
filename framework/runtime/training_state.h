#pragma once
// TrainingState: what a program's training state is made of, registered once: the model
// (parameters, buffers and the generators it registered, e.g. nn::Dropout's), the optimizer, the
// LR scheduler and anything else of the program's own (counters, generators). The Runtime
// (runtime.h) saves it to checkpoints (one checkpoint::Checkpointer entry per object, by name),
// sends it to a joining node, and restores it; its own counters (step, epoch, data position,
// averager, post-local hook) it adds itself.
//
// Usage:
//   runtime::Runtime rt({});
//   runtime::TrainingState& state = rt.state();
//   int64_t best = 0;
//   state.add("best", [&] { StateDict s; s.set("v", best); return s; },
//             [&](const StateDict& s) { best = s.get_int("v"); });
//   state.add_generator("noise", gen);   // a stream the program draws from
//
// Names are unique, contain no '.', and must be the same on every rank. Registered objects must
// outlive the Runtime.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "framework/checkpoint/checkpointer.h"
#include "framework/nn/module.h"
#include "framework/tensor/generator.h"
#include "framework/train/optimizer.h"
#include "framework/train/state_dict.h"

namespace hsgd::runtime {

// An LR schedule as the Runtime steps it: after every optimizer step.
class Scheduler {
 public:
  virtual ~Scheduler() = default;
  virtual void step() = 0;
  virtual StateDict state_dict() const = 0;
  virtual void load_state_dict(const StateDict& state) = 0;
};
// Makes the schedule for a run of total_steps steps over optimizer (e.g. cosine annealing to 0).
using SchedulerFactory =
    std::function<std::unique_ptr<Scheduler>(Optimizer& optimizer, int64_t total_steps)>;

class TrainingState {
 public:
  using SaveFn = std::function<StateDict()>;
  using LoadFn = std::function<void(const StateDict&)>;

  void add_module(const std::string& name, std::shared_ptr<nn::Module> module);
  void add(const std::string& name, SaveFn save, LoadFn load);
  template <checkpoint::Stateful T>
  void add(const std::string& name, std::shared_ptr<T> object) {
    HSGD_CHECK(object != nullptr, "TrainingState::add: '", name, "' is null");
    add(
        name, [object] { return StateDict(object->state_dict()); },
        [object](const StateDict& state) { object->load_state_dict(state); });
  }
  void add_generator(const std::string& name, Generator& generator);
  // Removes an entry (no-op when absent); the Runtime replaces its per-generation objects.
  void remove(const std::string& name);

  // Registers every entry with checkpointer under its name.
  void register_with(checkpoint::Checkpointer& checkpointer) const;
  // Every entry's state under "<name>." (copies, independent of the objects).
  StateDict state_dict() const;
  // Restores every entry from "<name>." of state; InvalidArgument naming the first entry that
  // has no state there (nothing is restored then).
  void load_state_dict(const StateDict& state) const;

 private:
  struct Entry {
    std::string name;
    SaveFn save;  // null for a module
    LoadFn load;
    std::shared_ptr<nn::Module> module;
  };
  std::vector<Entry> entries_;
};

}  // namespace hsgd::runtime
