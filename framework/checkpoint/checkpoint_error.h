#pragma once
// CheckpointError: what Checkpointer (checkpointer.h) and the checkpoint files
// (checkpoint_file.h) throw when a checkpoint cannot be written or read. Its own header so that
// checkpointer.h, and every application through hsgd.h, need not include the generated
// checkpoint.pb.h.
//
// Usage:
//   try {
//     // ... checkpointer.save(step); checkpointer.wait(); ...
//   } catch (const CheckpointError& e) {
//     if (e.kind() == CheckpointError::Kind::kNoSpace) {
//       // a retry would fail the same way: e.bytes_needed() > e.bytes_free()
//     }
//   }

#include <cstdint>
#include <optional>
#include <string>

#include "comm/error.h"

namespace hsgd::checkpoint {

// A checkpoint could not be written or read; the message names the file or directory.
class CheckpointError : public Error {
 public:
  enum class Kind {
    kOther,
    // The file system has no room for a checkpoint file (ENOSPC or EDQUOT, or fewer bytes free
    // than the file needs, found before writing). Nothing of the file is left behind. Retrying
    // on the same file system fails the same way until space is freed.
    kNoSpace,
  };

  using Error::Error;  // Kind::kOther
  CheckpointError(Kind kind, const std::string& message, uint64_t bytes_needed = 0,
                  uint64_t bytes_free = 0)
      : Error(message), kind_(kind), bytes_needed_(bytes_needed), bytes_free_(bytes_free) {}

  Kind kind() const { return kind_; }
  // kNoSpace: the bytes the file needs, and the bytes free on its file system once the write
  // failed (bytes_free_at; 0 when unknown). 0 for other kinds.
  uint64_t bytes_needed() const { return bytes_needed_; }
  uint64_t bytes_free() const { return bytes_free_; }

 private:
  Kind kind_ = Kind::kOther;
  uint64_t bytes_needed_ = 0;
  uint64_t bytes_free_ = 0;
};

// Bytes this process may still write on the file system holding path (statvfs: f_bavail blocks,
// f_bfree for root, times f_frsize), or nullopt when statvfs fails.
std::optional<uint64_t> bytes_free_at(const std::string& path);

// The kNoSpace error for writing bytes_needed into path (a file; its directory is measured):
// "checkpoint: no space for 'DIR/rank_0': it needs 5242880 bytes, the file system of 'DIR' has
// 1048576 bytes free (CAUSE); free space or point --checkpoint-dir elsewhere". cause: the system
// error, or "" when found before writing.
CheckpointError no_space_error(const std::string& path, uint64_t bytes_needed,
                               const std::string& cause);

// Whether errno value error means the file system is full (ENOSPC, EDQUOT).
bool is_no_space(int error);

}  // namespace hsgd::checkpoint
