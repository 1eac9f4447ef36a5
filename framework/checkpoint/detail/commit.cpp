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

// Rank 0: the manifest of step, from its own file and every other rank's report.
void write_manifest(const CommitContext& ctx, int64_t step, bool replicas_equal,
                    const proto::FileInfo& own_file) {
  comm::ProcessGroup& pg = ctx.pg;
  const std::string dir = step_dir(ctx.options.dir, step);
  proto::Manifest manifest;
  manifest.set_step(step);
  *manifest.mutable_run() = to_proto(ctx.run);
  manifest.set_replicas_equal(replicas_equal);
  manifest.set_unix_time_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count());
  *manifest.add_files() = own_file;
  std::vector<std::string> keys;
  for (int r = 1; r < pg.size(); ++r) keys.push_back(report_key(pg, step, r));
  std::vector<comm::Bytes> reports;
  if (!keys.empty()) {
    pg.store()->wait(keys, ctx.options.timeout);
    reports = pg.store()->multi_get(keys, ctx.options.timeout);
    for (const std::string& key : keys) pg.store()->delete_key(key);
  }
  std::string failures;
  for (size_t i = 0; i < reports.size(); ++i) {
    proto::WriteReport report;
    std::string failure;
    if (!report.ParseFromString(comm::to_string(reports[i]))) {
      failure = "its report does not parse";
    } else if (report.has_file()) {
      *manifest.add_files() = report.file();
      continue;
    } else {
      failure = "error " + report.error();
    }
    if (!failures.empty()) failures += "; ";
    failures += hsgd::str_cat("rank ", i + 1, ": ", failure);
  }
  if (!failures.empty()) {
    throw CheckpointError("checkpoint: '" + dir +
                          "' is incomplete (no manifest written): " + failures);
  }
  write_envelope(dir + "/" + kManifestName, kManifestKind, manifest.SerializeAsString());
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
    report.set_error(e.what());
    if (rank != 0) send_report(pg, step, report);
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
