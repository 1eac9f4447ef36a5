#include "framework/checkpoint/checkpointer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "comm/log.h"
#include "framework/checkpoint/detail/checkpointer_impl.h"
#include "framework/checkpoint/detail/collective_call.h"
#include "framework/checkpoint/detail/commit.h"
#include "framework/checkpoint/module_state.h"
#include "framework/tensor/grad_mode.h"

// Construction, registration, the snapshot and save; load() is in checkpointer_load.cpp.

namespace hsgd::checkpoint {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// RunInfo::local_world_size when the run leaves it 0: the launcher's layout as the group keeps it
// (the job's nodes, also for a subgroup), else LOCAL_WORLD_SIZE (a group built by hand under a
// launcher), else 1 for a world of one and 0 (not declared) otherwise.
int local_world_size(const comm::ProcessGroup& pg) {
  if (pg.local_world_size() > 0) return pg.local_world_size();
  if (const char* env = std::getenv("LOCAL_WORLD_SIZE")) {
    char* end = nullptr;
    const long value = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && value > 0 && value <= INT32_MAX) {
      return static_cast<int>(value);
    }
  }
  return pg.size() == 1 ? 1 : 0;
}

}  // namespace

const char* hsgd_version() {
#ifdef HSGD_VERSION_STRING
  return HSGD_VERSION_STRING;
#else
  return "unknown";
#endif
}

// ---- construction, registration ----

Checkpointer::Impl::Impl(CheckpointOptions options_in, std::shared_ptr<comm::ProcessGroup> pg_in,
                         RunInfo run_in)
    : options(std::move(options_in)), pg(std::move(pg_in)), run([&] {
        RunInfo r = std::move(run_in);
        if (r.world_size == 0 && pg != nullptr) r.world_size = pg->size();
        if (r.local_world_size == 0 && pg != nullptr) r.local_world_size = local_world_size(*pg);
        return r;
      }()) {
  HSGD_CHECK(pg != nullptr, "Checkpointer: process group is null");
  HSGD_CHECK(!options.dir.empty(), "Checkpointer: options.dir is empty");
  HSGD_CHECK(options.keep_last >= 1, "Checkpointer: keep_last ", options.keep_last,
             " must be at least 1");
  HSGD_CHECK(run.world_size == pg->size(), "Checkpointer: run.world_size ", run.world_size,
             " differs from the process group's size ", pg->size());
  HSGD_CHECK(run.local_world_size >= 0, "Checkpointer: run.local_world_size ", run.local_world_size,
             " must be at least 0 (0: the process group's)");
  HSGD_CHECK(pg->size() == 1 || pg->store() != nullptr,
             "Checkpointer: the process group has no store to report written files through");
  make_dirs(options.dir);
  // Fail now, not after an hour of training, when the directory is not writable.
  if (::access(options.dir.c_str(), W_OK | X_OK) != 0) {
    throw CheckpointError("checkpoint: the directory '" + options.dir +
                          "' is not writable: " + std::strerror(errno));
  }
}

Checkpointer::Checkpointer(CheckpointOptions options, std::shared_ptr<comm::ProcessGroup> pg,
                           RunInfo run)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(pg), std::move(run))) {}

Checkpointer::~Checkpointer() {
  try {
    wait();
  } catch (const std::exception& e) {
    comm::logger()->error("rank {}: the last checkpoint write failed: {}", impl_->pg->rank(),
                          e.what());
  }
}

void Checkpointer::add(const std::string& name, SaveFn save, LoadFn load) {
  impl_->add({.name = name, .save = std::move(save), .load = std::move(load), .module = nullptr});
}

void Checkpointer::Impl::add(Registered r) {
  const std::string& name = r.name;
  HSGD_CHECK(!name.empty() && name.find('.') == std::string::npos, "Checkpointer: name '", name,
             "' must be non-empty and contain no '.'");
  HSGD_CHECK(name != "entries", "Checkpointer: the name 'entries' is reserved for set_entry()");
  for (const Registered& other : registered) {
    HSGD_CHECK(other.name != name, "Checkpointer: '", name, "' is registered twice");
  }
  registered.push_back(std::move(r));
}

void Checkpointer::add_module(const std::string& name, std::shared_ptr<nn::Module> module) {
  HSGD_CHECK(module != nullptr, "Checkpointer::add_module: '", name, "' is null");
  // No save function: snapshot() copies the module's tensors itself (one memcpy each).
  impl_->add(
      {.name = name,
       .save = nullptr,
       .load = [module, name](const StateDict& state) { load_module_state(*module, name, state); },
       .module = module});
}

void Checkpointer::add_generator(const std::string& name, Generator& generator) {
  add(
      name, [&generator] { return generator_state(generator); },
      [&generator](const StateDict& state) { load_generator_state(generator, state); });
}

void Checkpointer::set_entry(const std::string& key, std::string bytes) {
  impl_->entries[key] = std::move(bytes);
}

std::optional<std::string> Checkpointer::entry(const std::string& key) const {
  const auto it = impl_->entries.find(key);
  if (it == impl_->entries.end()) return std::nullopt;
  return it->second;
}

const std::string& Checkpointer::dir() const { return impl_->options.dir; }
const RunInfo& Checkpointer::run() const { return impl_->run; }
const SaveStats& Checkpointer::last_save_stats() const { return impl_->stats; }

std::vector<int64_t> Checkpointer::complete_steps() const {
  return detail::complete_steps(impl_->options.dir);
}

// ---- saving ----

// The snapshot is built as a flat list of entries: registered names are unique and contain no
// '.', so prefixed keys cannot collide and need no lookup (StateDict::set searches; with a few
// hundred tensors that search was a large part of the stall, see checkpoint_bench). The tensors of
// registered modules are copied into views of one arena kept from save to save, so that the
// stall is a memcpy into memory that is already mapped, not a few hundred allocations (and, for
// large tensors, page faults on fresh memory). save() waits for the previous write before it
// reuses the arena.
StateEntries Checkpointer::Impl::snapshot() {
  NoGradGuard no_grad;
  std::vector<std::pair<const Registered*, nn::NamedTensors>> modules;
  int64_t arena_numel = 0;
  for (const Registered& r : registered) {
    if (!r.module) continue;
    modules.emplace_back(&r, r.module->state_dict());
    for (const auto& [key, t] : modules.back().second) arena_numel += t.numel();
  }
  if (!arena.defined() || arena.numel() < arena_numel) arena = empty({arena_numel});

  StateEntries state;
  int64_t offset = 0;
  auto module = modules.begin();
  for (const Registered& r : registered) {
    const std::string prefix = r.name + ".";
    if (r.module) {
      for (const auto& [key, t] : (module++)->second) {
        Tensor copy = arena.narrow(0, offset, t.numel()).view(t.shape());
        if (t.is_contiguous() && t.numel() > 0) {
          std::memcpy(copy.data(), t.data(), static_cast<size_t>(t.numel()) * sizeof(float));
        } else {
          copy.copy_(t);
        }
        offset += t.numel();
        state.emplace_back(prefix + key, std::move(copy));
      }
      for (const auto& [key, gen] : r.module->named_generators()) {
        state.emplace_back(prefix + key, gen->state_bytes());
      }
      continue;
    }
    const StateDict saved = r.save();
    for (const auto& [key, value] : saved.entries()) state.emplace_back(prefix + key, value);
  }
  for (const auto& [key, bytes] : entries) state.emplace_back("entries." + key, bytes);
  return state;
}

void Checkpointer::Impl::write(int64_t step, StateEntries state, bool replicas_equal) {
  detail::commit_step({.options = options, .pg = *pg, .run = run}, step, std::move(state),
                      replicas_equal, &pending_stats);
}

void Checkpointer::save(int64_t step, SaveOptions options) {
  Impl& impl = *impl_;
  HSGD_CHECK(step >= 0 && step > impl.last_step, "Checkpointer::save: step ", step,
             " must be non-negative and above the last saved step ", impl.last_step);
  detail::meet_in_call(*impl.pg, hsgd::str_cat("Checkpointer::save(step ", step, ")"));
  wait();
  const auto start = Clock::now();
  StateEntries state = impl.snapshot();
  impl.pending_stats = SaveStats{.snapshot_seconds = seconds_since(start)};
  impl.last_step = step;
  if (!impl.options.background) {
    impl.write(step, std::move(state), options.replicas_equal);
    impl.stats = impl.pending_stats;
    return;
  }
  impl.writer.submit([&impl, step, state = std::move(state), options]() mutable {
    impl.write(step, std::move(state), options.replicas_equal);
  });
  impl.pending = true;
}

void Checkpointer::wait() {
  Impl& impl = *impl_;
  if (!impl.pending) return;
  const std::exception_ptr error = impl.writer.wait();
  impl.stats = impl.pending_stats;
  impl.pending = false;
  if (error) std::rethrow_exception(error);
}

}  // namespace hsgd::checkpoint
