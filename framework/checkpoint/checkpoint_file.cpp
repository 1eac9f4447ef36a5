#include "framework/checkpoint/checkpoint_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <utility>

#include "framework/checkpoint/file_pieces.h"

namespace hsgd::checkpoint {
namespace {

[[noreturn]] void fail_errno(const std::string& what, const std::string& path, int error) {
  throw CheckpointError(
      is_no_space(error) ? CheckpointError::Kind::kNoSpace : CheckpointError::Kind::kOther,
      "checkpoint: cannot " + what + " '" + path + "': " + std::strerror(error));
}

}  // namespace

std::string rank_file_name(int rank) { return "rank_" + std::to_string(rank); }

std::string step_dir(const std::string& dir, int64_t step) {
  return dir + "/step_" + std::to_string(step);
}

int64_t parse_step_dir(const std::string& name) {
  constexpr std::string_view kPrefix = "step_";
  if (name.size() <= kPrefix.size() || name.compare(0, kPrefix.size(), kPrefix) != 0) return -1;
  int64_t step = 0;
  for (size_t i = kPrefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (int64_t{1} << 58)) return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

uint32_t crc32_of(const std::string& data) {
  return static_cast<uint32_t>(
      crc32_z(0L, reinterpret_cast<const Bytef*>(data.data()), data.size()));
}

proto::RankState encode_state(int rank, int64_t step, const StateDict& state) {
  proto::RankState out;
  out.set_rank(rank);
  out.set_step(step);
  out.mutable_entries()->Reserve(static_cast<int>(state.size()));
  for (const auto& [key, value] : state.entries()) {
    proto::Entry* entry = out.add_entries();
    entry->set_key(key);
    proto::Value* v = entry->mutable_value();
    if (const double* d = std::get_if<double>(&value)) {
      v->set_real(*d);
    } else if (const int64_t* i = std::get_if<int64_t>(&value)) {
      v->set_integer(*i);
    } else if (const std::string* b = std::get_if<std::string>(&value)) {
      v->set_blob(*b);
    } else {
      const Tensor t = std::get<Tensor>(value).contiguous();
      proto::TensorValue* tv = v->mutable_tensor();
      for (int64_t d : t.shape()) tv->add_shape(d);
      tv->set_data(reinterpret_cast<const char*>(t.data()),
                   static_cast<size_t>(t.numel()) * sizeof(float));
    }
  }
  return out;
}

StateDict decode_state(const proto::RankState& state, const std::string& path) {
  StateDict out;
  for (const proto::Entry& entry : state.entries()) {
    const proto::Value& v = entry.value();
    switch (v.kind_case()) {
      case proto::Value::kReal:
        out.set(entry.key(), v.real());
        break;
      case proto::Value::kInteger:
        out.set(entry.key(), v.integer());
        break;
      case proto::Value::kBlob:
        out.set(entry.key(), v.blob());
        break;
      case proto::Value::kTensor: {
        Shape shape(v.tensor().shape().begin(), v.tensor().shape().end());
        int64_t numel = 1;
        for (int64_t d : shape) {
          if (d < 0)
            throw CheckpointError("checkpoint: '" + path + "': entry '" + entry.key() +
                                  "' has a negative dimension");
          numel *= d;
        }
        const std::string& data = v.tensor().data();
        if (data.size() != static_cast<size_t>(numel) * sizeof(float)) {
          throw CheckpointError(str_cat("checkpoint: '", path, "': entry '", entry.key(),
                                        "' holds ", data.size(), " bytes, its shape needs ",
                                        numel * 4));
        }
        Tensor t = zeros(shape);
        std::memcpy(t.data(), data.data(), data.size());
        out.set(entry.key(), t);
        break;
      }
      default:
        throw CheckpointError("checkpoint: '" + path + "': entry '" + entry.key() +
                              "' has no value");
    }
  }
  return out;
}

namespace {

// Writes bytes to path atomically: a temporary file in the same directory, fsync, rename over
// path, fsync of the directory.
void write_atomically(const std::string& path, const FilePieces& bytes) {
  const std::filesystem::path final_path(path);
  const std::string dir = final_path.parent_path().string();
  const std::string tmp =
      dir + "/." + final_path.filename().string() + ".tmp." + std::to_string(::getpid());
  // A file that cannot fit fails before anything is created. (Free space is only a bound: the
  // file system's own blocks, or another writer, can still run it out; ENOSPC below.)
  const std::optional<uint64_t> free = bytes_free_at(dir);
  if (free && *free < bytes.size()) {
    throw no_space_error(path, bytes.size(),
                         std::string(std::strerror(ENOSPC)) + ", found before writing");
  }
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno("create", tmp, errno);
  int fd_to_close = fd;
  try {
    bytes.write_all(fd, tmp);
    if (::fsync(fd) != 0) fail_errno("fsync", tmp, errno);
    if (::close(std::exchange(fd_to_close, -1)) != 0) fail_errno("close", tmp, errno);
  } catch (const CheckpointError& e) {
    if (fd_to_close >= 0) ::close(fd_to_close);
    ::unlink(tmp.c_str());
    // Measured once the partial file is gone: what the file system holds without it.
    if (e.kind() == CheckpointError::Kind::kNoSpace) {
      throw no_space_error(path, bytes.size(), e.what());
    }
    throw;
  } catch (...) {
    if (fd_to_close >= 0) ::close(fd_to_close);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    fail_errno("rename the temporary file to", path, error);
  }
  fsync_dir(dir);
}

WrittenFile write_pieces(const std::string& path, const std::string& kind,
                         const FilePieces& payload) {
  const uint32_t crc = payload.crc32();
  const FilePieces file = envelope_of(kind, payload, crc);
  write_atomically(path, file);
  return {.size = file.size(), .crc32 = crc};
}

}  // namespace

WrittenFile write_envelope(const std::string& path, const std::string& kind, std::string payload) {
  FilePieces pieces;
  pieces.append_copy(payload);
  return write_pieces(path, kind, pieces);
}

WrittenFile write_rank_file(const std::string& path, int rank, int64_t step,
                            const StateEntries& entries) {
  return write_pieces(path, kRankKind, encode_rank_payload(rank, step, entries));
}

std::string read_envelope(const std::string& path, const std::string& kind, uint32_t* crc32) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_errno("open", path, errno);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail_errno("read", path, errno);
  proto::Envelope envelope;
  // A truncated file usually still parses up to its last complete field; the size and the
  // checksum below catch it.
  if (!envelope.ParseFromString(bytes) || envelope.kind() != kind) {
    throw CheckpointError(str_cat("checkpoint: '", path, "' is not a complete ", kind, " file (",
                                  bytes.size(), " bytes: truncated, or another kind of file)"));
  }
  if (envelope.format_version() != kFormatVersion) {
    throw CheckpointError(str_cat("checkpoint: '", path, "' has format version ",
                                  envelope.format_version(), ", this hsgd reads ", kFormatVersion));
  }
  if (envelope.payload().size() != envelope.payload_size()) {
    throw CheckpointError(str_cat("checkpoint: '", path,
                                  "' is truncated: ", envelope.payload().size(), " of ",
                                  envelope.payload_size(), " payload bytes"));
  }
  const uint32_t crc = crc32_of(envelope.payload());
  if (crc != envelope.crc32()) {
    throw CheckpointError(str_cat("checkpoint: '", path, "' is corrupt: checksum ", crc,
                                  " of its payload, expected ", envelope.crc32()));
  }
  if (crc32 != nullptr) *crc32 = crc;
  return std::move(*envelope.mutable_payload());
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_errno("open the directory", dir, errno);
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0) fail_errno("fsync the directory", dir, error);
}

void make_dirs(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    throw CheckpointError(
        is_no_space(error.value()) ? CheckpointError::Kind::kNoSpace
                                   : CheckpointError::Kind::kOther,
        "checkpoint: cannot create the directory '" + dir + "': " + error.message());
  }
}

}  // namespace hsgd::checkpoint
