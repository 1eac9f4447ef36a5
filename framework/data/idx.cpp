#include "framework/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <memory>
#include <string>

#include "comm/error.h"

namespace hsgd::data {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

uint32_t read_be32(const uint8_t* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) |
         uint32_t{bytes[3]};
}

// A gzip (or raw) file read in pieces.
class GzReader {
 public:
  explicit GzReader(const std::filesystem::path& path) : path_(path) {
    std::error_code ec;
    HSGD_CHECK(std::filesystem::is_regular_file(path, ec), "data file '", path.string(),
               "' does not exist or is not a regular file");
    file_.reset(gzopen(path.c_str(), "rb"));
    HSGD_CHECK(file_ != nullptr, "cannot open data file '", path.string(), "'");
  }

  // Reads up to n bytes into out; returns how many (fewer only at the end of the data).
  size_t read(uint8_t* out, size_t n) {
    size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
      const int got = gzread(file_.get(), out + done, chunk);
      if (got < 0) {
        int errnum = 0;
        const char* msg = gzerror(file_.get(), &errnum);
        HSGD_THROW(InvalidArgument, "cannot read data file '", path_.string(), "': ", msg);
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    if (done < n) {
      // A gzip stream cut short reads as a clean end with Z_BUF_ERROR pending.
      int errnum = Z_OK;
      const char* msg = gzerror(file_.get(), &errnum);
      HSGD_CHECK(errnum == Z_OK || errnum == Z_STREAM_END, "data file '", path_.string(),
                 "' is truncated or corrupt (zlib: ", msg, ")");
    }
    return done;
  }

 private:
  std::filesystem::path path_;
  std::unique_ptr<gzFile_s, GzCloser> file_;
};

// Reads and checks the header, then exactly the data it declares (see idx.h). Returns the
// dimensions; data receives the bytes after the header.
std::vector<int64_t> read_idx(const std::filesystem::path& path, uint32_t magic, int ndim,
                              uint64_t max_bytes, std::vector<uint8_t>& data) {
  GzReader reader(path);
  const size_t header = 4 + 4 * static_cast<size_t>(ndim);
  uint8_t head[16] = {};
  const size_t got_magic = reader.read(head, 4);
  // The magic first: a file of the wrong kind should be reported as such, not as truncated.
  HSGD_CHECK(got_magic == 4, "IDX file '", path.string(), "' is truncated: ", got_magic,
             " bytes, expected at least a 4-byte magic number");
  const uint32_t got = read_be32(head);
  HSGD_CHECK(got == magic, "IDX file '", path.string(), "' has magic number 0x", std::hex, got,
             ", expected 0x", magic, std::dec, " (", ndim, "-dimensional unsigned bytes)");
  const size_t got_sizes = reader.read(head + 4, header - 4);
  HSGD_CHECK(got_sizes == header - 4, "IDX file '", path.string(),
             "' is truncated: ", 4 + got_sizes, " bytes, expected a header of ", header, " bytes");
  std::vector<int64_t> dims;
  uint64_t numel = 1;
  std::string shape;
  for (int d = 0; d < ndim; ++d) {
    const uint32_t size = read_be32(head + 4 + 4 * d);
    dims.push_back(size);
    shape += (d ? " x " : "") + std::to_string(size);
    HSGD_CHECK(!__builtin_mul_overflow(numel, uint64_t{size}, &numel), "IDX file '", path.string(),
               "' declares sizes ", shape, "... whose product overflows");
  }
  HSGD_CHECK(numel <= max_bytes, "IDX file '", path.string(), "' declares sizes ", shape, " = ",
             numel, " bytes of data, more than the limit of ", max_bytes, " bytes");
  data.resize(numel + 1);  // one more byte detects trailing data
  const size_t n = reader.read(data.data(), data.size());
  HSGD_CHECK(n >= numel, "IDX file '", path.string(), "' is truncated: ", header + n,
             " bytes, expected ", header + numel, " for its header's sizes ", shape);
  HSGD_CHECK(n == numel, "IDX file '", path.string(), "' has unexpected trailing bytes after ",
             header + numel, " bytes (its header declares sizes ", shape, ")");
  data.resize(numel);
  return dims;
}

}  // namespace

IdxImages read_idx_images(const std::filesystem::path& path, uint64_t max_bytes) {
  IdxImages images;
  const std::vector<int64_t> dims = read_idx(path, kImagesMagic, 3, max_bytes, images.pixels);
  images.count = dims[0];
  images.rows = dims[1];
  images.cols = dims[2];
  return images;
}

std::vector<int64_t> read_idx_labels(const std::filesystem::path& path, uint64_t max_bytes) {
  std::vector<uint8_t> bytes;
  read_idx(path, kLabelsMagic, 1, max_bytes, bytes);
  return std::vector<int64_t>(bytes.begin(), bytes.end());
}

}  // namespace hsgd::data
