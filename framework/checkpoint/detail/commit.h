#pragma once
// Internal to Checkpointer: how one step's checkpoint becomes complete, and the directory's
// complete checkpoints. Every rank writes its file, then reports it to rank 0 through the process
// group's store as a serialized proto::WriteReport (the file's proto::FileInfo, or why it could
// not be written). Rank 0 writes the manifest, which lists every rank's FileInfo, only when every
// rank reported its file written; a checkpoint counts only when its manifest exists, so a crash
// at any moment leaves the whole checkpoint or none. A failure that is seen leaves nothing: the
// files are written atomically (checkpoint_file.h), and rank 0 removes DIR/step_<step> once every
// rank has reported (so that no rank still writes into it) when any file, or the manifest, could
// not be written.
//
// Usage:
//   CheckpointOptions options{.dir = "ckpt"};
//   RunInfo run{.model = "mlp", .world_size = pg->size()};
//   StateEntries state;  // the snapshot
//   SaveStats stats;
//   detail::commit_step({.options = options, .pg = *pg, .run = run}, /*step=*/8,
//                       std::move(state), /*replicas_equal=*/false, &stats);

#include <cstdint>
#include <string>
#include <vector>

#include "comm/process_group/process_group.h"
#include "framework/checkpoint/checkpoint_file.h"
#include "framework/checkpoint/checkpointer.h"

namespace hsgd::checkpoint::detail {

// Where a step's checkpoint goes and what its manifest records.
struct CommitContext {
  const CheckpointOptions& options;
  comm::ProcessGroup& pg;
  const RunInfo& run;
};

// Writes this rank's file of step (DIR/step_<step>/rank_<r>) from state, releasing state once it
// is written, and reports it to rank 0. Rank 0 then waits (options.timeout) for every other
// rank's report, writes the manifest and deletes what keep_last no longer keeps. Sets
// stats->bytes and stats->write_seconds. Throws CheckpointError when this rank's file could not
// be written, or on rank 0 when another rank's could not ("checkpoint: 'DIR/step_8' is
// incomplete (no manifest written, the directory removed): rank 1: error ..."), of kind kNoSpace
// when a file system had no room (on rank 0 also when another rank's had none);
// hsgd::Timeout when a report does not arrive in time.
void commit_step(const CommitContext& ctx, int64_t step, StateEntries state, bool replicas_equal,
                 SaveStats* stats);

// Steps of the complete checkpoints in dir (those with a manifest), ascending.
std::vector<int64_t> complete_steps(const std::string& dir);

// Deletes the checkpoints of dir older than newest_step that are not among the newest keep_last
// complete ones (their manifest first, so a half-deleted checkpoint never counts as complete),
// with the debris of incomplete ones. Logs a warning for what it cannot delete.
void prune(const std::string& dir, int keep_last, int64_t newest_step);

// The run as a manifest records it, with this build's hsgd_version().
proto::RunInfo to_proto(const RunInfo& run);
RunInfo from_proto(const proto::RunInfo& run);

}  // namespace hsgd::checkpoint::detail
