#pragma once
// Internal to Checkpointer: its state, shared by checkpointer.cpp (construction, registration,
// the snapshot, save) and checkpointer_load.cpp (load). How a step is written and committed is
// in commit.h, resharding in resharding.h, the background thread in writer_thread.h.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "framework/checkpoint/checkpoint_file.h"
#include "framework/checkpoint/checkpointer.h"
#include "framework/checkpoint/detail/writer_thread.h"

namespace hsgd::checkpoint {

struct Checkpointer::Impl {
  struct Registered {
    std::string name;
    SaveFn save;
    LoadFn load;
    std::shared_ptr<nn::Module> module;  // add_module: snapshot straight from its tensors
  };
  // The result of trying one candidate checkpoint on this rank (load()).
  struct Candidate {
    std::string error;  // empty when usable on this rank
    proto::Manifest manifest;
    StateDict state;  // what this rank restores
  };

  // Checks the options and creates options.dir (see Checkpointer's constructor).
  Impl(CheckpointOptions options, std::shared_ptr<comm::ProcessGroup> pg, RunInfo run);

  void add(Registered registered);
  // Copies every registered object's state (module tensors into arena).
  StateEntries snapshot();
  // Writes and commits step (detail::commit_step) from state; sets pending_stats.
  void write(int64_t step, StateEntries state, bool replicas_equal);
  Candidate try_candidate(const std::string& path) const;
  // Restores the registered objects and the entries from a usable candidate's state.
  void apply(const StateDict& state, const LoadedCheckpoint& loaded);

  // Constant after construction.
  const CheckpointOptions options;
  const std::shared_ptr<comm::ProcessGroup> pg;
  const RunInfo run;

  std::vector<Registered> registered;
  Tensor arena;  // the snapshot's copies of module tensors (kept: reused by the next save)
  std::map<std::string, std::string> entries;
  int64_t last_step = -1;
  SaveStats stats;
  bool pending = false;     // a save() whose write wait() has not collected
  SaveStats pending_stats;  // written by the writer thread; copied to stats by wait()
  // Last: destroyed first, so its thread ends before the state its job uses.
  detail::WriterThread writer;
};

}  // namespace hsgd::checkpoint
