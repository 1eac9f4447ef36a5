#include <filesystem>
#include <span>

#include "comm/log.h"
#include "framework/checkpoint/checkpointer.h"
#include "framework/checkpoint/detail/checkpointer_impl.h"
#include "framework/checkpoint/detail/collective_call.h"
#include "framework/checkpoint/detail/commit.h"
#include "framework/checkpoint/detail/resharding.h"

// Checkpointer::load: which checkpoint every rank resumes from (falling back past unusable
// ones), and restoring the registered objects from it.

namespace hsgd::checkpoint {
namespace fs = std::filesystem;
namespace {

// "2:2,4:4" or "(none)", for messages.
std::string shown(const std::string& value) { return value.empty() ? "(none)" : value; }

}  // namespace

Checkpointer::Impl::Candidate Checkpointer::Impl::try_candidate(const std::string& path) const {
  Candidate out;
  try {
    const std::string manifest_path = path + "/" + kManifestName;
    if (!out.manifest.ParseFromString(read_envelope(manifest_path, kManifestKind))) {
      throw CheckpointError("checkpoint: '" + manifest_path + "' does not parse as a manifest");
    }
    const int saved_world = out.manifest.run().world_size();
    if (saved_world != out.manifest.files_size() || saved_world < 1) {
      throw CheckpointError(hsgd::str_cat("checkpoint: '", manifest_path, "' lists ",
                                          out.manifest.files_size(), " files for world size ",
                                          saved_world));
    }
    // The same world size: this rank's own file. Another: every saved rank's file.
    std::vector<StateDict> states;
    for (int r : detail::saved_ranks_to_read(saved_world, pg->size(), pg->rank())) {
      const std::string file = path + "/" + rank_file_name(r);
      proto::RankState rank_state;
      uint32_t crc = 0;
      if (!rank_state.ParseFromString(read_envelope(file, kRankKind, &crc))) {
        throw CheckpointError("checkpoint: '" + file + "' does not parse as a rank state");
      }
      const proto::FileInfo& info = out.manifest.files(r);
      if (crc != info.crc32()) {
        throw CheckpointError(hsgd::str_cat("checkpoint: '", file, "' has checksum ", crc,
                                            ", the manifest recorded ", info.crc32(),
                                            " (a file from another write)"));
      }
      if (rank_state.rank() != r || rank_state.step() != out.manifest.step()) {
        throw CheckpointError(hsgd::str_cat(
            "checkpoint: '", file, "' holds rank ", rank_state.rank(), " of step ",
            rank_state.step(), ", expected rank ", r, " of step ", out.manifest.step()));
      }
      states.push_back(decode_state(rank_state, file));
    }
    out.state = detail::reshard(std::move(states), pg->rank(), path);
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

std::optional<LoadedCheckpoint> Checkpointer::load(const std::string& which) {
  detail::meet_in_call(*impl_->pg, "Checkpointer::load");
  wait();
  const bool automatic = which == "auto";
  std::vector<std::string> candidates;  // rank 0's list decides; newest first
  if (automatic) {
    const std::vector<int64_t> steps = complete_steps();
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      candidates.push_back(step_dir(impl_->options.dir, *it));
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
    if (impl_->pg->size() > 1) impl_->pg->broadcast(std::span<int64_t>(&step, 1), 0)->wait();
    if (step < 0) {
      if (!skipped.empty()) {
        comm::logger()->warn("rank {}: no usable checkpoint in '{}': {}", impl_->pg->rank(),
                             impl_->options.dir, skipped.back());
      }
      if (i > 0) {  // every rank tried at least rank 0's first candidate
        throw CheckpointError("checkpoint: no usable checkpoint in '" + impl_->options.dir + "'" +
                              (skipped.empty() ? "" : ": " + skipped.back()));
      }
      return std::nullopt;
    }
    const std::string path = automatic ? step_dir(impl_->options.dir, step) : which;
    Impl::Candidate candidate = impl_->try_candidate(path);
    double failures = candidate.error.empty() ? 0 : 1;
    if (impl_->pg->size() > 1) {
      impl_->pg->allreduce(std::span<double>(&failures, 1), comm::ReduceOp::kSum)->wait();
    }
    if (failures > 0) {
      if (!candidate.error.empty()) skipped.push_back(candidate.error);
      if (!automatic) {
        throw CheckpointError(candidate.error.empty()
                                  ? hsgd::str_cat("checkpoint: '", path, "' is unusable on ",
                                                  failures, " other rank(s)")
                                  : candidate.error);
      }
      if (impl_->pg->rank() == 0) {
        comm::logger()->warn("checkpoint: '{}' is unusable on {} rank(s); trying an older one",
                             path, failures);
      }
      continue;
    }
    LoadedCheckpoint loaded{.path = path,
                            .step = candidate.manifest.step(),
                            .written_with = detail::from_proto(candidate.manifest.run()),
                            .replicas_equal = candidate.manifest.replicas_equal(),
                            .partial = candidate.manifest.partial()};
    loaded.resized = loaded.written_with.world_size != impl_->pg->size();
    for (const std::string& why : skipped) {
      comm::logger()->warn("rank {}: {}; resumed from the previous complete checkpoint '{}'",
                           impl_->pg->rank(), why, path);
    }
    impl_->apply(candidate.state, loaded);
    return loaded;
  }
}

void Checkpointer::Impl::apply(const StateDict& state, const LoadedCheckpoint& loaded) {
  const RunInfo& saved = loaded.written_with;
  const std::string& path = loaded.path;
  HSGD_CHECK(saved.model == run.model, "checkpoint '", path, "' was written for model '",
             saved.model, "', this run builds '", run.model, "'");
  // One saved rank is one replica: equal to itself.
  if (loaded.resized) {
    HSGD_CHECK(loaded.replicas_equal || saved.world_size == 1, "checkpoint '", path,
               "' was written with world size ", saved.world_size, ", this run has ",
               run.world_size,
               "; only a checkpoint written by one rank or while all replicas were equal (ddp, "
               "or local-sgd / hierarchical at a step where the whole world averaged) resumes "
               "on another world size");
  } else if (!loaded.partial) {
    // A partial checkpoint holds no averager or loader state, so nothing in it depends on the
    // hierarchy (or the mode) it was written with.
    HSGD_CHECK(saved.hierarchy == run.hierarchy, "checkpoint '", path,
               "' was written with hierarchy ", shown(saved.hierarchy), ", this run has ",
               shown(run.hierarchy));
  }
  std::string left_alone;  // of a partial checkpoint: the objects it has no state for
  for (const Registered& r : registered) {
    const StateDict sub = state.with_prefix(r.name + ".");
    if (sub.size() == 0 && loaded.partial) {
      left_alone += (left_alone.empty() ? "'" : ", '") + r.name + "'";
      continue;
    }
    HSGD_CHECK(sub.size() > 0, "checkpoint '", path, "' has no state for '", r.name,
               "' (written with mode '", saved.mode, "', this run uses '", run.mode, "')");
    if (r.module != nullptr && !loaded.partial) {
      // A resume that restarted a random stream from its seed would not be the run it resumes.
      for (const auto& [key, gen] : r.module->named_generators()) {
        HSGD_CHECK(sub.contains(key), "checkpoint '", path, "' has no state for the generator '",
                   r.name, ".", key, "' (a random stream of the module, e.g. nn::Dropout's)");
      }
    }
    r.load(sub);
  }
  if (!left_alone.empty() && pg->rank() == 0) {
    comm::logger()->info("checkpoint '{}' is partial: {} left as they were", path, left_alone);
  }
  entries.clear();
  const StateDict saved_entries = state.with_prefix("entries.");
  for (const auto& [key, value] : saved_entries.entries()) {
    if (const std::string* bytes = std::get_if<std::string>(&value)) entries[key] = *bytes;
  }
  last_step = loaded.step;
}

}  // namespace hsgd::checkpoint
