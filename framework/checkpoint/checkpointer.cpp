#include "framework/checkpoint/checkpointer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>
#include <span>

#include "comm/log.h"
#include "framework/tensor/grad_mode.h"

namespace hsgd::checkpoint {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// "2:2,4:4" or "(none)", for messages.
std::string shown(const std::string& value) { return value.empty() ? "(none)" : value; }

proto::RunInfo to_proto(const RunInfo& run) {
  proto::RunInfo out;
  out.set_world_size(run.world_size);
  out.set_local_world_size(run.local_world_size);
  out.set_mode(run.mode);
  out.set_hierarchy(run.hierarchy);
  out.set_model(run.model);
  out.set_hsgd_version(hsgd_version());
  return out;
}

RunInfo from_proto(const proto::RunInfo& run) {
  return {.mode = run.mode(),
          .hierarchy = run.hierarchy(),
          .model = run.model(),
          .local_world_size = run.local_world_size(),
          .world_size = run.world_size()};
}

// The element-wise mean of tensors of one shape, accumulated in double (equal tensors average
// to themselves exactly).
Tensor mean_of(const std::vector<Tensor>& tensors, const std::string& key) {
  const Tensor& first = tensors.front();
  std::vector<double> sum(static_cast<size_t>(first.numel()), 0.0);
  for (const Tensor& t : tensors) {
    HSGD_CHECK(t.shape() == first.shape(), "checkpoint: entry '", key,
               "' has different shapes on the saved ranks");
    const float* data = t.data();
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += data[i];
  }
  Tensor out = zeros(first.shape());
  float* data = out.data();
  for (size_t i = 0; i < sum.size(); ++i) {
    data[i] = static_cast<float>(sum[i] / static_cast<double>(tensors.size()));
  }
  return out;
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

Checkpointer::Checkpointer(CheckpointOptions options, std::shared_ptr<comm::ProcessGroup> pg,
                           RunInfo run)
    : options_(std::move(options)), pg_(std::move(pg)), run_([&] {
        RunInfo r = std::move(run);
        if (r.world_size == 0 && pg_ != nullptr) r.world_size = pg_->size();
        return r;
      }()) {
  HSGD_CHECK(pg_ != nullptr, "Checkpointer: process group is null");
  HSGD_CHECK(!options_.dir.empty(), "Checkpointer: options.dir is empty");
  HSGD_CHECK(options_.keep_last >= 1, "Checkpointer: keep_last ", options_.keep_last,
             " must be at least 1");
  HSGD_CHECK(run_.world_size == pg_->size(), "Checkpointer: run.world_size ", run_.world_size,
             " differs from the process group's size ", pg_->size());
  HSGD_CHECK(pg_->size() == 1 || pg_->store() != nullptr,
             "Checkpointer: the process group has no store to report written files through");
  make_dirs(options_.dir);
  // Fail now, not after an hour of training, when the directory is not writable.
  if (::access(options_.dir.c_str(), W_OK | X_OK) != 0) {
    throw CheckpointError("checkpoint: the directory '" + options_.dir +
                          "' is not writable: " + std::strerror(errno));
  }
}

Checkpointer::~Checkpointer() {
  try {
    wait();
  } catch (const std::exception& e) {
    comm::logger()->error("rank {}: the last checkpoint write failed: {}", pg_->rank(), e.what());
  }
  if (writer_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    writer_.join();
  }
}

void Checkpointer::add(const std::string& name, SaveFn save, LoadFn load) {
  add_registered(
      {.name = name, .save = std::move(save), .load = std::move(load), .module = nullptr});
}

void Checkpointer::add_registered(Registered registered) {
  const std::string& name = registered.name;
  HSGD_CHECK(!name.empty() && name.find('.') == std::string::npos, "Checkpointer: name '", name,
             "' must be non-empty and contain no '.'");
  HSGD_CHECK(name != "entries", "Checkpointer: the name 'entries' is reserved for set_entry()");
  for (const Registered& r : registered_) {
    HSGD_CHECK(r.name != name, "Checkpointer: '", name, "' is registered twice");
  }
  registered_.push_back(std::move(registered));
}

void Checkpointer::add_module(const std::string& name, std::shared_ptr<nn::Module> module) {
  HSGD_CHECK(module != nullptr, "Checkpointer::add_module: '", name, "' is null");
  // No save function: snapshot() copies the module's tensors itself (one memcpy each).
  add_registered({.name = name,
                  .save = nullptr,
                  .load =
                      [module, name](const StateDict& state) {
                        nn::NamedTensors tensors;
                        for (const auto& [key, value] : state.entries()) {
                          const Tensor* t = std::get_if<Tensor>(&value);
                          HSGD_CHECK(t != nullptr, "checkpoint: module '", name, "' entry '", key,
                                     "' holds a ", state_value_type(value), ", expected a Tensor");
                          tensors.emplace_back(key, *t);
                        }
                        module->load_state_dict(tensors);
                      },
                  .module = module});
}

void Checkpointer::add_generator(const std::string& name, Generator& generator) {
  add(
      name,
      [&generator] {
        const Generator::State s = generator.state();
        StateDict state;
        for (int i = 0; i < 4; ++i) {
          state.set("word" + std::to_string(i), static_cast<int64_t>(s.words[i]));
        }
        state.set("has_spare_normal", int64_t{s.has_spare_normal});
        state.set("spare_normal", s.spare_normal);
        return state;
      },
      [&generator](const StateDict& state) {
        Generator::State s{};
        for (int i = 0; i < 4; ++i) {
          s.words[i] = static_cast<uint64_t>(state.get_int("word" + std::to_string(i)));
        }
        s.has_spare_normal = state.get_int("has_spare_normal") != 0;
        s.spare_normal = state.get_double("spare_normal");
        generator.set_state(s);
      });
}

std::optional<std::string> Checkpointer::entry(const std::string& key) const {
  const auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

// ---- saving ----

// The snapshot is built as a flat list of entries: registered names are unique and contain no
// '.', so prefixed keys cannot collide and need no lookup (StateDict::set searches; with a few
// hundred tensors that search was a large part of the stall, see checkpoint_bench). The tensors of
// registered modules are copied into views of one arena kept from save to save, so that the
// stall is a memcpy into memory that is already mapped, not a few hundred allocations (and, for
// large tensors, page faults on fresh memory). save() waits for the previous write before it
// reuses the arena.
StateEntries Checkpointer::snapshot() {
  NoGradGuard no_grad;
  std::vector<std::pair<const Registered*, nn::NamedTensors>> modules;
  int64_t arena_numel = 0;
  for (const Registered& r : registered_) {
    if (!r.module) continue;
    modules.emplace_back(&r, r.module->state_dict());
    for (const auto& [key, t] : modules.back().second) arena_numel += t.numel();
  }
  if (!arena_.defined() || arena_.numel() < arena_numel) arena_ = empty({arena_numel});

  StateEntries state;
  int64_t offset = 0;
  auto module = modules.begin();
  for (const Registered& r : registered_) {
    const std::string prefix = r.name + ".";
    if (r.module) {
      for (const auto& [key, t] : (module++)->second) {
        Tensor copy = arena_.narrow(0, offset, t.numel()).view(t.shape());
        if (t.is_contiguous() && t.numel() > 0) {
          std::memcpy(copy.data(), t.data(), static_cast<size_t>(t.numel()) * sizeof(float));
        } else {
          copy.copy_(t);
        }
        offset += t.numel();
        state.emplace_back(prefix + key, std::move(copy));
      }
      continue;
    }
    const StateDict saved = r.save();
    for (const auto& [key, value] : saved.entries()) state.emplace_back(prefix + key, value);
  }
  for (const auto& [key, bytes] : entries_) state.emplace_back("entries." + key, bytes);
  return state;
}

void Checkpointer::save(int64_t step, SaveOptions options) {
  HSGD_CHECK(step >= 0 && step > last_step_, "Checkpointer::save: step ", step,
             " must be non-negative and above the last saved step ", last_step_);
  wait();
  const auto start = Clock::now();
  StateEntries state = snapshot();
  pending_stats_ = SaveStats{.snapshot_seconds = seconds_since(start)};
  last_step_ = step;
  if (!options_.background) {
    write(step, std::move(state), options.replicas_equal);
    stats_ = pending_stats_;
    return;
  }
  // One writer thread for the Checkpointer's life: starting a thread per save cost 30 us to a
  // few ms of the stall on a busy machine (checkpoint_bench).
  if (!writer_.joinable()) writer_ = std::thread([this] { writer_loop(); });
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = [this, step, state = std::move(state), options]() mutable {
      write(step, std::move(state), options.replicas_equal);
    };
    busy_ = true;
  }
  pending_ = true;
  cv_.notify_all();
}

void Checkpointer::writer_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || job_ != nullptr; });
    if (job_ == nullptr) return;  // stop_, and nothing left to write
    std::function<void()> job = std::exchange(job_, nullptr);
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    job = nullptr;  // the snapshot's memory goes back outside the lock
    lock.lock();
    writer_error_ = error;
    busy_ = false;
    cv_.notify_all();
  }
}

void Checkpointer::wait() {
  if (pending_) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
    stats_ = pending_stats_;
    pending_ = false;
  }
  if (writer_error_) {
    std::exception_ptr error = std::exchange(writer_error_, nullptr);
    std::rethrow_exception(error);
  }
}

std::string Checkpointer::report_key(int64_t step, int rank) const {
  return pg_->key_prefix() + "checkpoint/step_" + std::to_string(step) + "/rank_" +
         std::to_string(rank);
}

void Checkpointer::write(int64_t step, StateEntries state, bool replicas_equal) {
  const auto start = Clock::now();
  const int rank = pg_->rank();
  const std::string dir = step_dir(options_.dir, step);
  std::string report;
  try {
    make_dirs(dir);
    // Straight from the snapshot's memory: no copy of the tensor bytes (checkpoint_bench).
    const WrittenFile file = write_rank_file(dir + "/" + rank_file_name(rank), rank, step, state);
    state = StateEntries();  // the snapshot's memory goes back before the manifest is awaited
    pending_stats_.bytes = file.size;
    own_file_crc_ = file.crc32;
    report = "ok " + std::to_string(file.size) + " " + std::to_string(file.crc32);
  } catch (const std::exception& e) {
    report = std::string("error ") + e.what();
    if (pg_->size() > 1) pg_->store()->set(report_key(step, rank), comm::to_bytes(report));
    throw;
  }
  pending_stats_.write_seconds = seconds_since(start);
  if (pg_->size() > 1 && rank != 0) {
    pg_->store()->set(report_key(step, rank), comm::to_bytes(report));
    return;
  }
  if (rank == 0) {
    if (pg_->size() > 1) pg_->store()->set(report_key(step, 0), comm::to_bytes(report));
    write_manifest(step, replicas_equal);
  }
}

void Checkpointer::write_manifest(int64_t step, bool replicas_equal) {
  const std::string dir = step_dir(options_.dir, step);
  proto::Manifest manifest;
  manifest.set_step(step);
  *manifest.mutable_run() = to_proto(run_);
  manifest.set_replicas_equal(replicas_equal);
  manifest.set_unix_time_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count());
  std::vector<std::string> keys;
  for (int r = 0; r < pg_->size(); ++r) keys.push_back(report_key(step, r));
  std::vector<comm::Bytes> reports;
  if (pg_->size() > 1) {
    pg_->store()->wait(keys, options_.timeout);
    reports = pg_->store()->multi_get(keys, options_.timeout);
    for (const std::string& key : keys) pg_->store()->delete_key(key);
  }
  std::vector<std::string> failures;
  for (int r = 0; r < pg_->size(); ++r) {
    proto::FileInfo* info = manifest.add_files();
    info->set_name(rank_file_name(r));
    if (pg_->size() == 1) {
      info->set_size(pending_stats_.bytes);
      info->set_crc32(own_file_crc_);
      continue;
    }
    const std::string report = comm::to_string(reports[static_cast<size_t>(r)]);
    unsigned long long size = 0;
    unsigned crc = 0;
    if (std::sscanf(report.c_str(), "ok %llu %u", &size, &crc) != 2) {
      failures.push_back("rank " + std::to_string(r) + ": " + report);
      continue;
    }
    info->set_size(size);
    info->set_crc32(crc);
  }
  if (!failures.empty()) {
    std::string all;
    for (const std::string& f : failures) all += (all.empty() ? "" : "; ") + f;
    throw CheckpointError("checkpoint: '" + dir + "' is incomplete (no manifest written): " + all);
  }
  write_envelope(dir + "/" + kManifestName, kManifestKind, manifest.SerializeAsString());
  prune(step);
}

std::vector<int64_t> Checkpointer::complete_steps() const {
  std::vector<int64_t> steps;
  std::error_code error;
  for (const fs::directory_entry& e : fs::directory_iterator(options_.dir, error)) {
    const int64_t step = parse_step_dir(e.path().filename().string());
    if (step >= 0 && fs::exists(e.path() / kManifestName, error)) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

void Checkpointer::prune(int64_t newest_step) const {
  const std::vector<int64_t> complete = complete_steps();
  std::set<int64_t> keep;
  for (auto it = complete.rbegin();
       it != complete.rend() && keep.size() < size_t(options_.keep_last); ++it) {
    if (*it <= newest_step) keep.insert(*it);
  }
  std::error_code error;
  for (const fs::directory_entry& e : fs::directory_iterator(options_.dir, error)) {
    const int64_t step = parse_step_dir(e.path().filename().string());
    // Newer directories are being written; kept ones stay.
    if (step < 0 || step >= newest_step || keep.count(step) != 0) continue;
    // The manifest goes first, so a half-deleted checkpoint never counts as complete.
    fs::remove(e.path() / kManifestName, error);
    fs::remove_all(e.path(), error);
    if (error) {
      comm::logger()->warn("checkpoint: could not delete old checkpoint '{}': {}",
                           e.path().string(), error.message());
    }
  }
}

// ---- loading ----

struct Checkpointer::Candidate {
  std::string error;  // empty when usable on this rank
  proto::Manifest manifest;
  StateDict state;  // what this rank restores
};

Checkpointer::Candidate Checkpointer::try_candidate(const std::string& path) const {
  Candidate out;
  try {
    const std::string manifest_path = path + "/" + kManifestName;
    if (!out.manifest.ParseFromString(read_envelope(manifest_path, kManifestKind))) {
      throw CheckpointError("checkpoint: '" + manifest_path + "' does not parse as a manifest");
    }
    const int saved_world = out.manifest.run().world_size();
    if (saved_world != out.manifest.files_size() || saved_world < 1) {
      throw CheckpointError(detail::str_cat("checkpoint: '", manifest_path, "' lists ",
                                            out.manifest.files_size(), " files for world size ",
                                            saved_world));
    }
    // The same world size: this rank's own file. Another: every saved rank's file, averaged.
    std::vector<int> ranks;
    if (saved_world == pg_->size()) {
      ranks.push_back(pg_->rank());
    } else {
      for (int r = 0; r < saved_world; ++r) ranks.push_back(r);
    }
    std::vector<StateDict> states;
    for (int r : ranks) {
      const std::string file = path + "/" + rank_file_name(r);
      proto::RankState rank_state;
      uint32_t crc = 0;
      if (!rank_state.ParseFromString(read_envelope(file, kRankKind, &crc))) {
        throw CheckpointError("checkpoint: '" + file + "' does not parse as a rank state");
      }
      const proto::FileInfo& info = out.manifest.files(r);
      if (crc != info.crc32()) {
        throw CheckpointError(detail::str_cat("checkpoint: '", file, "' has checksum ", crc,
                                              ", the manifest recorded ", info.crc32(),
                                              " (a file from another write)"));
      }
      if (rank_state.rank() != r || rank_state.step() != out.manifest.step()) {
        throw CheckpointError(detail::str_cat(
            "checkpoint: '", file, "' holds rank ", rank_state.rank(), " of step ",
            rank_state.step(), ", expected rank ", r, " of step ", out.manifest.step()));
      }
      states.push_back(decode_state(rank_state, file));
    }
    if (states.size() == 1) {
      out.state = std::move(states.front());
      return out;
    }
    // Averaged tensors; other values from saved rank (rank % saved world).
    const StateDict& own = states[static_cast<size_t>(pg_->rank() % saved_world)];
    for (const auto& [key, value] : own.entries()) {
      if (!std::holds_alternative<Tensor>(value)) {
        out.state.set(key, value);
        continue;
      }
      std::vector<Tensor> all;
      for (const StateDict& s : states) {
        const StateValue* v = s.find(key);
        HSGD_CHECK(v != nullptr && std::holds_alternative<Tensor>(*v), "checkpoint: '", path,
                   "': entry '", key, "' is not a tensor on every saved rank");
        all.push_back(std::get<Tensor>(*v));
      }
      out.state.set(key, mean_of(all, key));
    }
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

std::optional<LoadedCheckpoint> Checkpointer::load(const std::string& which) {
  wait();
  const bool automatic = which == "auto";
  std::vector<std::string> candidates;  // rank 0's list decides; newest first
  if (automatic) {
    const std::vector<int64_t> steps = complete_steps();
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      candidates.push_back(step_dir(options_.dir, *it));
    }
  } else {
    candidates.push_back(which);
  }
  std::vector<std::string> skipped;  // "path: why" of candidates this rank could not use
  for (size_t i = 0;; ++i) {
    // Rank 0 names the candidate (its step, or -1 when none is left), so every rank tries the
    // same one even if their directory listings differ.
    int64_t step = -1;
    if (i < candidates.size()) {
      step = automatic ? parse_step_dir(fs::path(candidates[i]).filename().string()) : 0;
    }
    if (pg_->size() > 1) pg_->broadcast(std::span<int64_t>(&step, 1), 0)->wait();
    if (step < 0) {
      if (!skipped.empty()) {
        comm::logger()->warn("rank {}: no usable checkpoint in '{}': {}", pg_->rank(), options_.dir,
                             skipped.back());
      }
      if (i > 0) {  // every rank tried at least rank 0's first candidate
        throw CheckpointError("checkpoint: no usable checkpoint in '" + options_.dir + "'" +
                              (skipped.empty() ? "" : ": " + skipped.back()));
      }
      return std::nullopt;
    }
    const std::string path = automatic ? step_dir(options_.dir, step) : which;
    Candidate candidate = try_candidate(path);
    double failures = candidate.error.empty() ? 0 : 1;
    if (pg_->size() > 1) {
      pg_->allreduce(std::span<double>(&failures, 1), comm::ReduceOp::kSum)->wait();
    }
    if (failures > 0) {
      if (!candidate.error.empty()) skipped.push_back(candidate.error);
      if (!automatic) {
        throw CheckpointError(candidate.error.empty()
                                  ? detail::str_cat("checkpoint: '", path, "' is unusable on ",
                                                    failures, " other rank(s)")
                                  : candidate.error);
      }
      if (pg_->rank() == 0) {
        comm::logger()->warn("checkpoint: '{}' is unusable on {} rank(s); trying an older one",
                             path, failures);
      }
      continue;
    }
    LoadedCheckpoint loaded{.path = path,
                            .step = candidate.manifest.step(),
                            .written_with = from_proto(candidate.manifest.run()),
                            .replicas_equal = candidate.manifest.replicas_equal(),
                            .partial = candidate.manifest.partial()};
    loaded.resized = loaded.written_with.world_size != pg_->size();
    for (const std::string& why : skipped) {
      comm::logger()->warn("rank {}: {}; resumed from the previous complete checkpoint '{}'",
                           pg_->rank(), why, path);
    }
    apply(candidate.state, loaded);
    return loaded;
  }
}

void Checkpointer::apply(const StateDict& state, const LoadedCheckpoint& loaded) {
  const RunInfo& saved = loaded.written_with;
  const std::string& path = loaded.path;
  HSGD_CHECK(saved.model == run_.model, "checkpoint '", path, "' was written for model '",
             saved.model, "', this run builds '", run_.model, "'");
  if (loaded.resized) {
    HSGD_CHECK(loaded.replicas_equal, "checkpoint '", path, "' was written with world size ",
               saved.world_size, ", this run has ", run_.world_size,
               "; only a checkpoint written while all replicas were equal (ddp, or local-sgd / "
               "hierarchical at a step where the whole world averaged) resumes on another "
               "world size");
  } else {
    HSGD_CHECK(saved.hierarchy == run_.hierarchy, "checkpoint '", path,
               "' was written with hierarchy ", shown(saved.hierarchy), ", this run has ",
               shown(run_.hierarchy));
  }
  std::string left_alone;  // of a partial checkpoint: the objects it has no state for
  for (const Registered& r : registered_) {
    const StateDict sub = state.with_prefix(r.name + ".");
    if (sub.size() == 0 && loaded.partial) {
      left_alone += (left_alone.empty() ? "'" : ", '") + r.name + "'";
      continue;
    }
    HSGD_CHECK(sub.size() > 0, "checkpoint '", path, "' has no state for '", r.name,
               "' (written with mode '", saved.mode, "', this run uses '", run_.mode, "')");
    r.load(sub);
  }
  if (!left_alone.empty() && pg_->rank() == 0) {
    comm::logger()->info("checkpoint '{}' is partial: {} left as they were", path, left_alone);
  }
  entries_.clear();
  const StateDict entries = state.with_prefix("entries.");
  for (const auto& [key, value] : entries.entries()) {
    if (const std::string* bytes = std::get_if<std::string>(&value)) entries_[key] = *bytes;
  }
  last_step_ = loaded.step;
}

}  // namespace hsgd::checkpoint
