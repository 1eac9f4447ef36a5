#pragma once
// Reader for the IDX files of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/).
//
// An IDX file is a big-endian header, magic = 0x00 0x00 <type> <ndim>, then ndim uint32 sizes,
// then the data. Only unsigned-byte data (type 0x08) is used by these data sets: images are
// (count, rows, cols) with magic 0x00000803, labels are (count) with magic 0x00000801.
//
// Files may be gzip-compressed or raw: zlib's gzread passes raw files through unchanged, so the
// same code reads both and the caller need not know which it has.
//
// The header is read and checked first (sizes multiplied with overflow checks, the total
// compared with max_bytes), then exactly the data it declares is inflated, plus one byte to
// detect trailing data: a gzip bomb or a header declaring absurd sizes is refused before any
// large allocation, and inflating stops at the declared size.
//
// Errors: a missing or unreadable file, a truncated file (header or data shorter than the
// header promises, or a gzip stream that ends early), a wrong magic number, a declared size
// that overflows or exceeds max_bytes, or trailing bytes throw hsgd::InvalidArgument naming the
// file and what was expected.
//
// Usage:
//   IdxImages train = read_idx_images(dir / "train-images-idx3-ubyte.gz");
//   std::vector<int64_t> labels = read_idx_labels(dir / "train-labels-idx1-ubyte.gz");

#include <cstdint>
#include <filesystem>
#include <vector>

namespace hsgd::data {

// Images of an IDX3 file. pixels is (count, rows, cols), row-major, one byte per pixel.
struct IdxImages {
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> pixels;
};

// Largest data (bytes after the header) accepted by default: 1 GiB, 20x MNIST's training images.
inline constexpr uint64_t kMaxIdxDataBytes = uint64_t{1} << 30;

// Reads an image file (magic 0x00000803).
IdxImages read_idx_images(const std::filesystem::path& path, uint64_t max_bytes = kMaxIdxDataBytes);

// Reads a label file (magic 0x00000801); labels are returned widened to int64.
std::vector<int64_t> read_idx_labels(const std::filesystem::path& path,
                                     uint64_t max_bytes = kMaxIdxDataBytes);

}  // namespace hsgd::data
