#pragma once
// FilePieces: the bytes of a checkpoint file as a list of pieces, small encoded headers owned
// here and tensor data borrowed from the tensors themselves, so that a rank file is checksummed
// and written straight from the snapshot without copying the tensor bytes (writev).
//
// Why: serializing through protobuf copied every tensor byte three times (into the RankState,
// into the payload string, into the Envelope's string), each into freshly mapped memory; for a
// ResNet-18 state (89 MB) that was ~450 ms of the ~700 ms background write (checkpoint_bench).
//
// encode_rank_payload() produces exactly the bytes of
// encode_state(rank, step, state).SerializeAsString() (proto3 wire format, fields in number
// order, defaults omitted as protobuf omits them; tests/framework/checkpoint/file_pieces_test
// compares them byte for byte), so the format and its readers are unchanged.
//
// Usage:
//   #include <fcntl.h>
//   StateDict state;
//   state.set("step", int64_t{100});
//   FilePieces payload = encode_rank_payload(rank, 100, state);   // borrows state's tensors
//   FilePieces file = envelope_of(kRankKind, payload, payload.crc32());   // header + payload
//   const std::string path = "ckpt/step_100/rank_0";
//   const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
//   file.write_all(fd, path);
//
// A FilePieces holds Tensor handles of what it borrows (shallow: the storage stays alive), but
// the tensors must not be modified until it is written. Not thread-safe.

#include <sys/uio.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "framework/tensor/tensor.h"
#include "framework/train/state_dict.h"

namespace hsgd::checkpoint {

class FilePieces {
 public:
  // Appends a copy of bytes (small: headers, keys, scalars).
  void append_copy(std::string_view bytes);
  // Appends t's float32 values without copying them (t is made contiguous first if needed).
  void append_tensor(const Tensor& t);
  // Appends other's pieces (its copies are copied, its tensors borrowed again).
  void append(const FilePieces& other);

  uint64_t size() const { return size_; }
  // zlib's crc32 of all the bytes, in order.
  uint32_t crc32() const;
  // The bytes as one string (for tests and small files).
  std::string to_string() const;
  // Writes all the bytes to fd (writev in batches, retrying short writes and EINTR); throws
  // CheckpointError naming path and the system error.
  void write_all(int fd, const std::string& path) const;

 private:
  struct Piece {
    bool owned;     // in owned_ at offset, else at data
    size_t offset;  // into owned_
    const char* data;
    size_t size;
  };
  std::vector<iovec> iovecs() const;

  std::string owned_;
  std::vector<Piece> pieces_;
  std::vector<Tensor> borrowed_;  // keeps the storage of borrowed pieces alive
  uint64_t size_ = 0;
};

// The serialized RankState of rank at step holding state (see the file comment).
FilePieces encode_rank_payload(int rank, int64_t step,
                               const std::vector<std::pair<std::string, StateValue>>& entries);
inline FilePieces encode_rank_payload(int rank, int64_t step, const StateDict& state) {
  return encode_rank_payload(rank, step, state.entries());
}

// The serialized Envelope of kind around payload (format version kFormatVersion, payload's size
// and crc32), as write_envelope() writes it.
FilePieces envelope_of(const std::string& kind, const FilePieces& payload, uint32_t payload_crc);

}  // namespace hsgd::checkpoint
