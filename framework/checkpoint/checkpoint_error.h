#pragma once
// CheckpointError: what Checkpointer (checkpointer.h) and the checkpoint files
// (checkpoint_file.h) throw when a checkpoint cannot be written or read. Its own header so that
// checkpointer.h, and every application through hsgd.h, need not include the generated
// checkpoint.pb.h.

#include "comm/error.h"

namespace hsgd::checkpoint {

// A checkpoint could not be written or read; the message names the file or directory.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

}  // namespace hsgd::checkpoint
