#pragma once
// The files of a checkpoint (format: checkpoint.proto): encoding a StateDict into a rank file and
// back, the manifest, atomic writes and checked reads. Used by Checkpointer; usable alone by
// tools (e.g. to inspect or convert a checkpoint).
//
// Atomic write: the bytes go to a temporary file in the same directory, which is fsynced, renamed
// over the final name and followed by an fsync of the directory, so after a crash at any moment
// the final name holds either the complete new file or nothing (or the old file).
//
// Checked read: the whole file is read, its envelope parsed, the payload's size and crc32
// compared with the envelope's before the payload is parsed. Any failure throws CheckpointError
// naming the path and what is wrong ("truncated: 812 of 4096 payload bytes", "checksum
// mismatch", "not a checkpoint file").

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.pb.h"  // generated from framework/checkpoint/checkpoint.proto
#include "comm/error.h"
#include "framework/checkpoint/checkpoint_error.h"
#include "framework/train/state_dict.h"

namespace hsgd::checkpoint {

inline constexpr uint32_t kFormatVersion = 1;
inline constexpr const char* kRankKind = "hsgd-checkpoint-rank";
inline constexpr const char* kManifestKind = "hsgd-checkpoint-manifest";
inline constexpr const char* kManifestName = "manifest";

// "rank_<r>".
std::string rank_file_name(int rank);
// "<dir>/step_<step>".
std::string step_dir(const std::string& dir, int64_t step);

// The step of a directory name "step_<N>", or -1 when the name has another form.
int64_t parse_step_dir(const std::string& name);

// A StateDict's entries in order (StateDict::entries()); what a snapshot is built as.
using StateEntries = std::vector<std::pair<std::string, StateValue>>;

// zlib's crc32 of data.
uint32_t crc32_of(const std::string& data);

// StateDict <-> RankState entries. Tensors are copied.
proto::RankState encode_state(int rank, int64_t step, const StateDict& state);
StateDict decode_state(const proto::RankState& state, const std::string& path);

// What an atomic write produced.
struct WrittenFile {
  uint64_t size = 0;   // bytes of the file
  uint32_t crc32 = 0;  // of the payload
};

// Wraps payload in an Envelope of kind and writes it atomically to path (see above). Throws
// CheckpointError naming the path and the system error (e.g. "No space left on device").
WrittenFile write_envelope(const std::string& path, const std::string& kind, std::string payload);

// The rank file of rank at step holding state, written atomically as
// write_envelope(path, kRankKind, encode_state(rank, step, state).SerializeAsString()) would write
// it, byte for byte, but checksummed and written straight from the tensors' memory (no copies of
// tensor data; file_pieces.h). The tensors must not change until it returns.
WrittenFile write_rank_file(const std::string& path, int rank, int64_t step,
                            const StateEntries& entries);
inline WrittenFile write_rank_file(const std::string& path, int rank, int64_t step,
                                   const StateDict& state) {
  return write_rank_file(path, rank, step, state.entries());
}

// Reads path, checks the envelope's kind, size and checksum, and returns the payload (and its
// crc32 in *crc32 when given).
std::string read_envelope(const std::string& path, const std::string& kind,
                          uint32_t* crc32 = nullptr);

// Flushes a directory's entries (after a rename or a mkdir in it).
void fsync_dir(const std::string& dir);

// Creates dir and its missing parents (mkdir -p); CheckpointError naming it on failure.
void make_dirs(const std::string& dir);

}  // namespace hsgd::checkpoint
