#include "framework/checkpoint/detail/commit.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>

#include "comm/log.h"

namespace hsgd::checkpoint::detail {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

// The store key of rank's report of step.
std::string report_key(const comm::ProcessGroup& pg, int64_t step, int rank) {
  return pg.key_prefix() + "checkpoint/step_" + std::to_string(step) + "/rank_" +
         std::to_string(rank);
}

void send_report(comm::ProcessGroup& pg, int64_t step, const proto::WriteReport& report) {
  pg.store()->set(report_key(pg, step, pg.rank()), comm::to_bytes(report.SerializeAsString()));
}

// Rank 0: every other rank's report of step (waiting up to options.timeout), their keys deleted.
std::vector<proto::WriteReport> collect_reports(const CommitContext& ctx, int64_t step) {
  comm::ProcessGroup& pg = ctx.pg;
  std::vector<std::string> keys;
  for (int r = 1; r < pg.size(); ++r) keys.push_back(report_key(pg, step, r));
  std::vector<proto::WriteReport> reports(keys.size());
  if (keys.empty()) return reports;
  pg.store()->wait(keys, ctx.options.timeout);
  const std::vector<comm::Bytes> bytes = pg.store()->multi_get(keys, ctx.options.timeout);
  for (const std::string& key : keys) pg.store()->delete_key(key);
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (!reports[i].ParseFromString(comm::to_string(bytes[i]))) {
      reports[i].Clear();
      reports[i].set_error("its report does not parse");
    }
  }
  return reports;
}

// Rank 0, once no rank writes into dir any more (every report is in): removes the step's
// directory, so that a checkpoint that failed leaves nothing half-made behind.
void remove_step_dir(const std::string& dir) {
  std::error_code error;
  fs::remove_all(dir, error);
  if (error) {
    comm::logger()->warn("checkpoint: could not remove the incomplete checkpoint '{}': {}", dir,
                         error.message());
  }
}

// Rank 0: the manifest of step, from its own file and every other rank's report.
void write_manifest(const CommitContext& ctx, int64_t step, bool replicas_equal,
                    const proto::FileInfo& own_file) {
  const std::string dir = step_dir(ctx.options.dir, step);
  proto::Manifest manifest;
  manifest.set_step(step);
  *manifest.mutable_run() = to_proto(ctx.run);
  manifest.set_replicas_equal(replicas_equal);
  manifest.set_unix_time_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count());
  *manifest.add_files() = own_file;
  const std::vector<proto::WriteReport> reports = collect_reports(ctx, step);
  std::string failures;
  const proto::WriteReport* no_space = nullptr;  // the first rank whose disk was full
  for (size_t i = 0; i < reports.size(); ++i) {
    if (reports[i].has_file()) {
      *manifest.add_files() = reports[i].file();
      continue;
    }
    if (reports[i].no_space() && no_space == nullptr) no_space = &reports[i];
    if (!failures.empty()) failures += "; ";
    failures += hsgd::str_cat("rank ", i + 1, ": error ", reports[i].error());
  }
  if (!failures.empty()) {
    remove_step_dir(dir);
    const std::string message =
        "checkpoint: '" + dir +
        "' is incomplete (no manifest written, the directory removed): " + failures;
    if (no_space == nullptr) throw CheckpointError(message);
    throw CheckpointError(CheckpointError::Kind::kNoSpace, message, no_space->bytes_needed(),
                          no_space->bytes_free());
  }
  try {
    write_envelope(dir + "/" + kManifestName, kManifestKind, manifest.SerializeAsString());
  } catch (const CheckpointError&) {
    remove_step_dir(dir);
    throw;
  }
  prune(ctx.options.dir, ctx.options.keep_last, step);
}

}  // namespace

void commit_step(const CommitContext& ctx, int64_t step, StateEntries state, bool replicas_equal,
                 SaveStats* stats) {
  const auto start = Clock::now();
  comm::ProcessGroup& pg = ctx.pg;
  const int rank = pg.rank();
  const std::string dir = step_dir(ctx.options.dir, step);
  proto::WriteReport report;
  try {
    make_dirs(dir);
    // Straight from the snapshot's memory: no copy of the tensor bytes (checkpoint_bench).
    const WrittenFile file = write_rank_file(dir + "/" + rank_file_name(rank), rank, step, state);
    state = StateEntries();  // the snapshot's memory goes back before the manifest is awaited
    stats->bytes = file.size;
    proto::FileInfo* info = report.mutable_file();
    info->set_name(rank_file_name(rank));
    info->set_size(file.size);
    info->set_crc32(file.crc32);
  } catch (const std::exception& e) {
    // The file itself left nothing behind (checkpoint_file.h); the directory goes on rank 0,
    // after every rank reported, so that no rank still writes into it.
    report.set_error(e.what());
    const auto* error = dynamic_cast<const CheckpointError*>(&e);
    if (error != nullptr && error->kind() == CheckpointError::Kind::kNoSpace) {
      report.set_no_space(true);
      report.set_bytes_needed(error->bytes_needed());
      report.set_bytes_free(error->bytes_free());
    }
    if (rank != 0) {
      send_report(pg, step, report);
    } else {
      try {
        collect_reports(ctx, step);
        remove_step_dir(dir);
      } catch (const std::exception& late) {  // a report that does not come: leave the debris
        comm::logger()->warn(
            "checkpoint: '{}' is left incomplete: waiting for the other ranks' reports failed: "
            "{}",
            dir, late.what());
      }
    }
    throw;
  }
  stats->write_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (rank != 0) {
    send_report(pg, step, report);
  } else {
    write_manifest(ctx, step, replicas_equal, report.file());
  }
}

std::vector<int64_t> complete_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code error;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, error)) {
    const int64_t step = parse_step_dir(e.path().filename().string());
    if (step >= 0 && fs::exists(e.path() / kManifestName, error)) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

void prune(const std::string& dir, int keep_last, int64_t newest_step) {
  const std::vector<int64_t> complete = complete_steps(dir);
  std::set<int64_t> keep;
  for (auto it = complete.rbegin(); it != complete.rend() && keep.size() < size_t(keep_last);
       ++it) {
    if (*it <= newest_step) keep.insert(*it);
  }
  std::error_code error;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, error)) {
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

}  // namespace hsgd::checkpoint::detail
