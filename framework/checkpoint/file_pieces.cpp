#include "framework/checkpoint/file_pieces.h"

#include <limits.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <variant>

#include "framework/checkpoint/checkpoint_file.h"

namespace hsgd::checkpoint {
namespace {

// ---- the protobuf wire format (https://protobuf.dev/programming-guides/encoding/) ----

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLength = 2 };

size_t varint_size(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_tag(std::string& out, uint32_t field, WireType type) {
  put_varint(out, field << 3 | type);
}

size_t tag_size(uint32_t field) { return varint_size(field << 3); }

// A length-delimited field of `size` bytes: tag, length, then the bytes.
size_t length_field_size(uint32_t field, size_t size) {
  return tag_size(field) + varint_size(size) + size;
}

void put_length_header(std::string& out, uint32_t field, size_t size) {
  put_tag(out, field, kLength);
  put_varint(out, size);
}

// Negative int32/int64 values are encoded as their 64-bit two's complement (10 bytes).
uint64_t as_varint(int64_t v) { return static_cast<uint64_t>(v); }

// ---- RankState (checkpoint.proto) ----
// RankState { int32 rank = 1; int64 step = 2; repeated Entry entries = 3; }
// Entry { string key = 1; Value value = 2; }
// Value { oneof kind { double real = 1; int64 integer = 2; TensorValue tensor = 3; bytes blob = 4;
// } } TensorValue { repeated int64 shape = 1 [packed]; bytes data = 2; } proto3 omits scalars,
// strings and bytes equal to their default, and an empty packed field; the member of a oneof and a
// set message field are always written.

size_t packed_shape_size(const Shape& shape) {
  size_t n = 0;
  for (int64_t d : shape) n += varint_size(as_varint(d));
  return n;
}

size_t tensor_value_size(const Shape& shape, size_t data_bytes) {
  size_t n = 0;
  if (!shape.empty()) n += length_field_size(1, packed_shape_size(shape));
  if (data_bytes > 0) n += length_field_size(2, data_bytes);
  return n;
}

size_t value_size(const StateValue& value, const Tensor* tensor) {
  if (const int64_t* i = std::get_if<int64_t>(&value))
    return tag_size(2) + varint_size(as_varint(*i));
  if (std::holds_alternative<double>(value)) return tag_size(1) + 8;
  if (const std::string* b = std::get_if<std::string>(&value))
    return length_field_size(4, b->size());
  const size_t bytes = static_cast<size_t>(tensor->numel()) * sizeof(float);
  return length_field_size(3, tensor_value_size(tensor->shape(), bytes));
}

void encode_value(FilePieces& out, std::string& header, const StateValue& value,
                  const Tensor* tensor) {
  if (const int64_t* i = std::get_if<int64_t>(&value)) {
    put_tag(header, 2, kVarint);
    put_varint(header, as_varint(*i));
  } else if (const double* d = std::get_if<double>(&value)) {
    put_tag(header, 1, kFixed64);
    char bytes[8];
    std::memcpy(bytes, d, 8);  // little-endian, as the format (and every supported machine)
    header.append(bytes, 8);
  } else if (const std::string* b = std::get_if<std::string>(&value)) {
    put_length_header(header, 4, b->size());
    header += *b;
  } else {
    const size_t bytes = static_cast<size_t>(tensor->numel()) * sizeof(float);
    put_length_header(header, 3, tensor_value_size(tensor->shape(), bytes));
    if (!tensor->shape().empty()) {
      put_length_header(header, 1, packed_shape_size(tensor->shape()));
      for (int64_t d : tensor->shape()) put_varint(header, as_varint(d));
    }
    if (bytes > 0) {
      put_length_header(header, 2, bytes);
      out.append_copy(header);
      header.clear();
      out.append_tensor(*tensor);
    }
  }
}

}  // namespace

// ---- FilePieces ----

void FilePieces::append_copy(std::string_view bytes) {
  if (bytes.empty()) return;
  // Adjacent copies merge into one piece (fewer iovecs).
  if (!pieces_.empty() && pieces_.back().owned &&
      pieces_.back().offset + pieces_.back().size == owned_.size()) {
    pieces_.back().size += bytes.size();
  } else {
    pieces_.push_back(
        {.owned = true, .offset = owned_.size(), .data = nullptr, .size = bytes.size()});
  }
  owned_.append(bytes);
  size_ += bytes.size();
}

void FilePieces::append_tensor(const Tensor& t) {
  const Tensor c = t.contiguous();
  const size_t bytes = static_cast<size_t>(c.numel()) * sizeof(float);
  if (bytes == 0) return;
  borrowed_.push_back(c);
  pieces_.push_back({.owned = false,
                     .offset = 0,
                     .data = reinterpret_cast<const char*>(c.data()),
                     .size = bytes});
  size_ += bytes;
}

void FilePieces::append(const FilePieces& other) {
  for (const Piece& p : other.pieces_) {
    if (p.owned) {
      append_copy(std::string_view(other.owned_).substr(p.offset, p.size));
    } else {
      pieces_.push_back(p);
      size_ += p.size;
    }
  }
  borrowed_.insert(borrowed_.end(), other.borrowed_.begin(), other.borrowed_.end());
}

std::vector<iovec> FilePieces::iovecs() const {
  std::vector<iovec> out;
  out.reserve(pieces_.size());
  for (const Piece& p : pieces_) {
    const char* data = p.owned ? owned_.data() + p.offset : p.data;
    out.push_back({const_cast<char*>(data), p.size});
  }
  return out;
}

uint32_t FilePieces::crc32() const {
  uLong crc = crc32_z(0L, Z_NULL, 0);
  for (const iovec& v : iovecs()) {
    crc = crc32_z(crc, static_cast<const Bytef*>(v.iov_base), v.iov_len);
  }
  return static_cast<uint32_t>(crc);
}

std::string FilePieces::to_string() const {
  std::string out;
  out.reserve(size_);
  for (const iovec& v : iovecs()) out.append(static_cast<const char*>(v.iov_base), v.iov_len);
  return out;
}

void FilePieces::write_all(int fd, const std::string& path) const {
  std::vector<iovec> v = iovecs();
  size_t next = 0;  // the first iovec not completely written
  while (next < v.size()) {
    const int count = static_cast<int>(std::min<size_t>(v.size() - next, IOV_MAX));
    const ssize_t n = ::writev(fd, v.data() + next, count);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      throw CheckpointError(
          is_no_space(error) ? CheckpointError::Kind::kNoSpace : CheckpointError::Kind::kOther,
          "checkpoint: cannot write '" + path + "': " + std::strerror(error));
    }
    // Skip what was written; a short write leaves a partly written iovec to resume.
    size_t left = static_cast<size_t>(n);
    while (next < v.size() && left >= v[next].iov_len) left -= v[next++].iov_len;
    if (left > 0) {
      v[next].iov_base = static_cast<char*>(v[next].iov_base) + left;
      v[next].iov_len -= left;
    }
  }
}

// ---- encoding ----

FilePieces encode_rank_payload(int rank, int64_t step,
                               const std::vector<std::pair<std::string, StateValue>>& entries) {
  FilePieces out;
  std::string header;
  if (rank != 0) {
    put_tag(header, 1, kVarint);
    put_varint(header, as_varint(rank));
  }
  if (step != 0) {
    put_tag(header, 2, kVarint);
    put_varint(header, as_varint(step));
  }
  for (const auto& [key, value] : entries) {
    Tensor tensor;
    if (const Tensor* t = std::get_if<Tensor>(&value)) tensor = t->contiguous();
    const size_t value_bytes = value_size(value, &tensor);
    const size_t entry_bytes =
        (key.empty() ? 0 : length_field_size(1, key.size())) + length_field_size(2, value_bytes);
    put_length_header(header, 3, entry_bytes);
    if (!key.empty()) {
      put_length_header(header, 1, key.size());
      header += key;
    }
    put_length_header(header, 2, value_bytes);
    encode_value(out, header, value, &tensor);
  }
  out.append_copy(header);
  return out;
}

FilePieces envelope_of(const std::string& kind, const FilePieces& payload, uint32_t payload_crc) {
  // Envelope { string kind = 1; uint32 format_version = 2; uint32 crc32 = 3;
  //            uint64 payload_size = 4; bytes payload = 5; }
  std::string header;
  if (!kind.empty()) {
    put_length_header(header, 1, kind.size());
    header += kind;
  }
  put_tag(header, 2, kVarint);
  put_varint(header, kFormatVersion);
  if (payload_crc != 0) {
    put_tag(header, 3, kVarint);
    put_varint(header, payload_crc);
  }
  if (payload.size() != 0) {
    put_tag(header, 4, kVarint);
    put_varint(header, payload.size());
    put_length_header(header, 5, payload.size());
  }
  FilePieces out;
  out.append_copy(header);
  out.append(payload);
  return out;
}

}  // namespace hsgd::checkpoint
