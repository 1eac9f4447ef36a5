#include "framework/checkpoint/checkpoint_error.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

namespace hsgd::checkpoint {

std::optional<uint64_t> bytes_free_at(const std::string& path) {
  struct statvfs fs {};
  if (::statvfs(path.c_str(), &fs) != 0) return std::nullopt;
  // Root may write into the blocks reserved for it; refusing it there would stop a job that fits.
  const auto blocks = static_cast<uint64_t>(::geteuid() == 0 ? fs.f_bfree : fs.f_bavail);
  return blocks * static_cast<uint64_t>(fs.f_frsize);
}

CheckpointError no_space_error(const std::string& path, uint64_t bytes_needed,
                               const std::string& cause) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const std::optional<uint64_t> free = bytes_free_at(dir.empty() ? "." : dir);
  return CheckpointError(
      CheckpointError::Kind::kNoSpace,
      str_cat("checkpoint: no space for '", path, "': it needs ", bytes_needed,
              " bytes, the file system of '", dir, "' has ",
              free ? str_cat(*free, " bytes free") : std::string("an unknown amount free"),
              cause.empty() ? "" : " (", cause, cause.empty() ? "" : ")",
              "; free space there or write checkpoints elsewhere"),
      bytes_needed, free.value_or(0));
}

bool is_no_space(int error) { return error == ENOSPC || error == EDQUOT; }

}  // namespace hsgd::checkpoint
