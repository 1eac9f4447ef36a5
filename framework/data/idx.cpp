#include "framework/data/idx.h"

#include <zlib.h>

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

uint32_t read_be32(const std::vector<uint8_t>& bytes, size_t offset) {
  return (uint32_t{bytes[offset]} << 24) | (uint32_t{bytes[offset + 1]} << 16) |
         (uint32_t{bytes[offset + 2]} << 8) | uint32_t{bytes[offset + 3]};
}

// Checks magic and sizes; returns the dimensions. The data must be exactly as long as the header
// says: shorter means truncated, longer means it is not the file we think it is.
std::vector<int64_t> parse_header(const std::vector<uint8_t>& bytes, uint32_t magic, int ndim,
                                  const std::filesystem::path& path) {
  // The magic first: a file of the wrong kind should be reported as such, not as truncated.
  HSGD_CHECK(bytes.size() >= 4, "IDX file '", path.string(), "' is truncated: ", bytes.size(),
             " bytes, expected at least a 4-byte magic number");
  const uint32_t got = read_be32(bytes, 0);
  HSGD_CHECK(got == magic, "IDX file '", path.string(), "' has magic number 0x", std::hex, got,
             ", expected 0x", magic, std::dec, " (", ndim, "-dimensional unsigned bytes)");
  const size_t header = 4 + 4 * static_cast<size_t>(ndim);
  HSGD_CHECK(bytes.size() >= header, "IDX file '", path.string(), "' is truncated: ", bytes.size(),
             " bytes, expected a header of ", header, " bytes");
  std::vector<int64_t> dims;
  size_t expected = header;
  size_t numel = 1;
  for (int d = 0; d < ndim; ++d) {
    dims.push_back(read_be32(bytes, 4 + 4 * static_cast<size_t>(d)));
    numel *= static_cast<size_t>(dims.back());
  }
  expected += numel;
  HSGD_CHECK(bytes.size() >= expected, "IDX file '", path.string(),
             "' is truncated: ", bytes.size(), " bytes, expected ", expected,
             " for its header's sizes");
  HSGD_CHECK(bytes.size() == expected, "IDX file '", path.string(), "' has ",
             bytes.size() - expected, " unexpected trailing bytes after ", expected, " bytes");
  return dims;
}

}  // namespace

std::vector<uint8_t> read_maybe_gzip(const std::filesystem::path& path) {
  std::error_code ec;
  HSGD_CHECK(std::filesystem::is_regular_file(path, ec), "data file '", path.string(),
             "' does not exist or is not a regular file");
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  HSGD_CHECK(file != nullptr, "cannot open data file '", path.string(), "'");
  std::vector<uint8_t> bytes;
  constexpr unsigned kChunk = 1 << 20;
  while (true) {
    const size_t old_size = bytes.size();
    bytes.resize(old_size + kChunk);
    const int n = gzread(file.get(), bytes.data() + old_size, kChunk);
    if (n < 0) {
      int errnum = 0;
      const char* msg = gzerror(file.get(), &errnum);
      HSGD_THROW(InvalidArgument, "cannot read data file '", path.string(), "': ", msg);
    }
    bytes.resize(old_size + static_cast<size_t>(n));
    if (n == 0) break;
  }
  // A gzip stream cut short reads as a clean EOF with Z_BUF_ERROR pending.
  int errnum = Z_OK;
  const char* msg = gzerror(file.get(), &errnum);
  HSGD_CHECK(errnum == Z_OK || errnum == Z_STREAM_END, "data file '", path.string(),
             "' is truncated or corrupt (zlib: ", msg, ")");
  return bytes;
}

IdxImages read_idx_images(const std::filesystem::path& path) {
  std::vector<uint8_t> bytes = read_maybe_gzip(path);
  const std::vector<int64_t> dims = parse_header(bytes, kImagesMagic, 3, path);
  IdxImages images{.count = dims[0], .rows = dims[1], .cols = dims[2], .pixels = {}};
  images.pixels.assign(bytes.begin() + 16, bytes.end());
  return images;
}

std::vector<int64_t> read_idx_labels(const std::filesystem::path& path) {
  std::vector<uint8_t> bytes = read_maybe_gzip(path);
  parse_header(bytes, kLabelsMagic, 1, path);
  return std::vector<int64_t>(bytes.begin() + 8, bytes.end());
}

}  // namespace hsgd::data
