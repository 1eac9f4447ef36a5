#pragma once
// Checkpointer: durable training runs. Register the objects whose state makes up a run once;
// then save(step) now and then, and load() at start-up resumes from the newest complete
// checkpoint (one call instead of restoring each object by hand).
//
// Usage:
//   checkpoint::Checkpointer ckpt({.dir = "ckpt"}, world,
//                                 {.mode = "hierarchical", .hierarchy = "2:2,4:4",
//                                  .model = "resnet20"});
//   optim::StepLR scheduler(*optimizer, {.step_size = 30});
//   ckpt.add_module("model", model);            // parameters, buffers and generators
//   ckpt.add("optimizer", *optimizer);           // anything with state_dict()/load_state_dict()
//   ckpt.add("scheduler", scheduler);            //   (optimizers, LR schedulers, averagers,
//   ckpt.add("loader", loader);                  //    PostLocalSGDState, DataLoader)
//   ckpt.add_generator("augment_rng", gen);
//   int64_t step = 0;
//   if (auto resumed = ckpt.load()) step = resumed->step;   // also resumed->path
//   for (const data::Batch& batch : loader) {
//     // ... train one step on batch ...
//     if (++step % 100 == 0) ckpt.save(step);
//   }
//   ckpt.wait();                                 // the last write is on disk
//
// Layout: DIR/step_<N>/rank_<r> (one file per rank) and DIR/step_<N>/manifest (format:
// checkpoint.proto). Every file carries a crc32 of its payload and is written atomically
// (temporary file, fsync, rename, fsync of the directory). A checkpoint counts only when its
// manifest exists, and rank 0 writes the manifest only after every rank reported its file
// written (through the process group's store), so a crash at any moment leaves the whole
// checkpoint or none. After a new manifest exists, rank 0 keeps the newest keep_last complete
// checkpoints and deletes older ones and the debris of incomplete older ones. The directory must
// be one file system seen by every rank (as with torch.distributed.checkpoint).
//
// save() does not stall training: it copies the registered state in memory (the snapshot) and
// returns; a background thread encodes and writes the files. The next save() (or wait()) first
// waits for the previous write and rethrows its error, a CheckpointError naming the directory
// or file (unwritable directory; disk full: kind kNoSpace, with the bytes needed and free). A
// write that fails leaves no step directory behind. The training state is never touched by a
// save.
//
// What is saved is what is registered. add_module saves a module's parameters and buffers by
// dotted name and the position of every generator it registered (Module::register_generator,
// e.g. nn::Dropout's masks), so a resumed run draws the same random numbers as an uninterrupted
// one. A DataLoader's shuffle and the bundled transforms (data/transforms.h) draw from (seed,
// epoch, index) alone and need no saved stream. Not saved unless the program registers it
// (add_generator): any other Generator the program draws from while training, and the
// process-wide default generator (hsgd::manual_seed), which the bundled layers use only at
// construction. data::CIFAR10's own augmentation stream (CIFAR10Options::augment) is not saved:
// a resumed run draws other crops and flips than an uninterrupted one; data::RandomCropFlip has
// the same augmentation and resumes exactly.
//
// load() is collective over the process group. It tries the newest complete checkpoint first;
// every rank checks the checksums of the files it needs before anything is restored. When a
// rank finds a file corrupt, truncated or missing, all ranks fall back to the previous complete
// checkpoint; the rank that found it logs a warning naming the file and the checkpoint used
// instead. It refuses (InvalidArgument naming both values) a checkpoint written for another
// model, another hierarchy, or another world size — except that a checkpoint written while all
// replicas were equal (SaveOptions::replicas_equal; recorded in the manifest) resumes on any
// world size: tensors (parameters, momentum buffers, ...) are the average over the saved ranks
// (equal replicas average to themselves), other values come from saved rank (rank % saved
// world size), and a DataLoader continues its epoch at the global number of samples seen.
// A checkpoint written by one rank holds one replica and also resumes on any world size.
// A checkpoint whose manifest is marked partial (written by a tool, e.g. scripts/import_torch.py
// with only the model) restores the registered objects it has state for and leaves the others as
// they are (a module's generators too), whatever mode and hierarchy it was written with; any
// other checkpoint must hold state for every registered object and module generator.
//
// Registered objects must outlive the Checkpointer (the shared_ptr overloads keep them alive);
// names must be the same on every rank, unique, and contain no '.'.
// Thread-safety: one thread calls everything (the background writer is internal).

#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_group/process_group.h"
#include "framework/checkpoint/checkpoint_error.h"
#include "framework/nn/module.h"
#include "framework/tensor/generator.h"
#include "framework/train/state_dict.h"

namespace hsgd::checkpoint {

struct CheckpointOptions {
  std::string dir;    // required; created if missing
  int keep_last = 2;  // complete checkpoints kept (>= 1)
  // How long rank 0's writer waits for the other ranks' reports before giving up on a step.
  comm::Duration timeout = comm::kDefaultTimeout;
  // false: save() returns once the files (and, on rank 0, the manifest) are written.
  bool background = true;
};

// What a run is; recorded in every manifest and compared by load().
struct RunInfo {
  std::string mode = "";       // e.g. "ddp", "local-sgd", "hierarchical"
  std::string hierarchy = "";  // e.g. "2:2,4:4"; empty when there is none
  std::string model = "";      // e.g. "resnet20"
  // Ranks per node. 0: the process group's (ProcessGroup::local_world_size, the launcher's
  // LOCAL_WORLD_SIZE), else the environment's LOCAL_WORLD_SIZE, else 1 in a world of one and 0
  // (not declared) otherwise.
  int local_world_size = 0;
  int world_size = 0;  // 0: the process group's size
};

struct SaveOptions {
  // Every replica's parameters are equal at this step (DDP; or an averaging over the whole
  // world just happened), so the checkpoint may resume on another world size.
  bool replicas_equal = false;
};

// What load() restored.
struct LoadedCheckpoint {
  std::string path;  // DIR/step_<N>
  int64_t step = 0;
  RunInfo written_with;
  bool replicas_equal = false;
  bool resized = false;  // written with another world size
  bool partial = false;  // a partial checkpoint (see load()): some objects were left as they were
};

// Timings of the last completed save, for benchmarks and logs.
struct SaveStats {
  double snapshot_seconds = 0;  // the training stall: copying the state in memory
  double write_seconds = 0;     // encode + write + fsync of this rank's file (background)
  uint64_t bytes = 0;           // of this rank's file
};

// The hsgd version written into manifests ("0.1.0").
const char* hsgd_version();

template <typename T>
concept Stateful = requires(T& object, const StateDict& state) {
  { object.state_dict() } -> std::convertible_to<StateDict>;
  object.load_state_dict(state);
};

class Checkpointer {
 public:
  using SaveFn = std::function<StateDict()>;
  using LoadFn = std::function<void(const StateDict&)>;

  // Creates options.dir (CheckpointError naming it when that fails or it is not writable).
  // pg: the job's process group (rank, size, and its store for the write reports).
  Checkpointer(CheckpointOptions options, std::shared_ptr<comm::ProcessGroup> pg, RunInfo run);
  // Waits for a pending write; logs (does not throw) its error.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // ---- registration ----
  // Parameters and buffers by dotted name (strict on load: same names and shapes).
  void add_module(const std::string& name, std::shared_ptr<nn::Module> module);
  void add(const std::string& name, SaveFn save, LoadFn load);
  template <Stateful T>
  void add(const std::string& name, T& object) {
    add(
        name, [&object] { return StateDict(object.state_dict()); },
        [&object](const StateDict& state) { object.load_state_dict(state); });
  }
  template <Stateful T>
  void add(const std::string& name, std::shared_ptr<T> object) {
    HSGD_CHECK(object != nullptr, "Checkpointer::add: '", name, "' is null");
    add(
        name, [object] { return StateDict(object->state_dict()); },
        [object](const StateDict& state) { object->load_state_dict(state); });
  }
  void add_generator(const std::string& name, Generator& generator);

  // The application's own entries (e.g. its best accuracy), saved with every later save() and
  // filled by load().
  void set_entry(const std::string& key, std::string bytes);
  std::optional<std::string> entry(const std::string& key) const;

  // ---- saving ----
  // Snapshots every registered object now, then writes DIR/step_<step> (see above). Collective
  // in effect: every rank must save the same steps. Waits for the previous write first and
  // rethrows its error. InvalidArgument when step is negative or not above the last saved step.
  void save(int64_t step, SaveOptions options = {});
  // Blocks until the pending write is done; rethrows its error (once).
  void wait();
  const SaveStats& last_save_stats() const;

  // ---- loading ----
  // which: "auto" (the newest complete checkpoint in DIR, falling back as above; nullopt when
  // there is none) or the path of one checkpoint directory (no fallback: its problems throw).
  // Collective over the process group.
  std::optional<LoadedCheckpoint> load(const std::string& which = "auto");

  // Steps of the complete checkpoints in DIR (those with a manifest), ascending.
  std::vector<int64_t> complete_steps() const;
  const std::string& dir() const;
  const RunInfo& run() const;

 private:
  // The registered objects, the snapshot arena, the writer thread
  // (framework/checkpoint/detail/checkpointer_impl.h): the header stays free of the checkpoint
  // format's generated code.
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hsgd::checkpoint
