#include "framework/data/idx.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "comm/error.h"

namespace hsgd::data {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("hsgd_idx_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static void put_be32(std::vector<uint8_t>& out, uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
  }
  static std::vector<uint8_t> images_bytes(uint32_t count, uint32_t rows, uint32_t cols) {
    std::vector<uint8_t> out;
    put_be32(out, 0x803);
    put_be32(out, count);
    put_be32(out, rows);
    put_be32(out, cols);
    for (uint32_t i = 0; i < count * rows * cols; ++i) out.push_back(static_cast<uint8_t>(i * 7));
    return out;
  }
  static std::vector<uint8_t> labels_bytes(const std::vector<uint8_t>& labels) {
    std::vector<uint8_t> out;
    put_be32(out, 0x801);
    put_be32(out, static_cast<uint32_t>(labels.size()));
    out.insert(out.end(), labels.begin(), labels.end());
    return out;
  }
  fs::path write_raw(const std::string& name, const std::vector<uint8_t>& bytes) {
    fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  fs::path write_gz(const std::string& name, const std::vector<uint8_t>& bytes) {
    fs::path p = dir_ / name;
    gzFile f = gzopen(p.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    EXPECT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    gzclose(f);
    return p;
  }
  // Runs fn, expects InvalidArgument whose message contains every fragment.
  template <typename Fn>
  static void expect_invalid(Fn fn, const std::vector<std::string>& fragments) {
    try {
      fn();
      ADD_FAILURE() << "expected hsgd::InvalidArgument";
    } catch (const InvalidArgument& e) {
      for (const auto& f : fragments) {
        EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
            << "message '" << e.what() << "' lacks '" << f << "'";
      }
    }
  }

  fs::path dir_;
};

TEST_F(IdxTest, ReadsRawAndGzipImagesIdentically) {
  const std::vector<uint8_t> bytes = images_bytes(3, 4, 5);
  for (const fs::path& p : {write_raw("img", bytes), write_gz("img.gz", bytes)}) {
    const IdxImages images = read_idx_images(p);
    EXPECT_EQ(images.count, 3);
    EXPECT_EQ(images.rows, 4);
    EXPECT_EQ(images.cols, 5);
    ASSERT_EQ(images.pixels.size(), 60u);
    for (size_t i = 0; i < images.pixels.size(); ++i) {
      EXPECT_EQ(images.pixels[i], bytes[16 + i]) << "pixel " << i << " of " << p;
    }
  }
}

TEST_F(IdxTest, ReadsLabels) {
  const std::vector<uint8_t> labels = {9, 0, 3, 255};
  for (const fs::path& p :
       {write_raw("lab", labels_bytes(labels)), write_gz("lab.gz", labels_bytes(labels))}) {
    const std::vector<int64_t> got = read_idx_labels(p);
    ASSERT_EQ(got.size(), labels.size());
    for (size_t i = 0; i < labels.size(); ++i) EXPECT_EQ(got[i], labels[i]) << "label " << i;
  }
}

TEST_F(IdxTest, MissingFile_NamesThePath) {
  const fs::path p = dir_ / "nope-images.gz";
  expect_invalid([&] { read_idx_images(p); }, {p.string(), "does not exist"});
}

TEST_F(IdxTest, WrongMagic_NamesFileAndExpectedMagic) {
  const fs::path p = write_gz("labels-as-images.gz", labels_bytes({1, 2, 3}));
  expect_invalid([&] { read_idx_images(p); }, {p.string(), "magic", "0x801", "expected 0x803"});
}

TEST_F(IdxTest, TruncatedData_NamesFile) {
  std::vector<uint8_t> bytes = images_bytes(2, 3, 3);
  bytes.resize(bytes.size() - 4);
  for (const fs::path& p : {write_raw("short", bytes), write_gz("short.gz", bytes)}) {
    expect_invalid([&] { read_idx_images(p); }, {p.string(), "truncated", "expected 34"});
  }
}

TEST_F(IdxTest, TruncatedHeader_NamesFile) {
  const fs::path p = write_raw("tiny", {0, 0, 8, 3, 0});
  expect_invalid([&] { read_idx_images(p); }, {p.string(), "truncated", "header of 16"});
}

TEST_F(IdxTest, TruncatedGzipStream_NamesFile) {
  const fs::path full = write_gz("full.gz", images_bytes(20, 10, 10));
  std::ifstream in(full, std::ios::binary);
  std::vector<char> gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  gz.resize(gz.size() / 2);
  const fs::path p = write_raw("cut.gz", std::vector<uint8_t>(gz.begin(), gz.end()));
  expect_invalid([&] { read_idx_images(p); }, {p.string()});
}

TEST_F(IdxTest, TrailingBytes_AreRejected) {
  std::vector<uint8_t> bytes = labels_bytes({1, 2});
  bytes.push_back(7);
  const fs::path p = write_raw("long", bytes);
  expect_invalid([&] { read_idx_labels(p); }, {p.string(), "trailing"});
}

// A header whose sizes multiply past 2^64 (65536 x 2^24 x 2^24 wraps to 0 in 64 bits): refused
// naming the sizes, before anything is allocated.
TEST_F(IdxTest, HeaderSizesThatOverflow_AreRejected) {
  std::vector<uint8_t> bytes;
  put_be32(bytes, 0x803);
  put_be32(bytes, 65536);
  put_be32(bytes, 1u << 24);
  put_be32(bytes, 1u << 24);
  const fs::path p = write_raw("overflow", bytes);
  expect_invalid([&] { read_idx_images(p); }, {p.string(), "overflows", "65536 x 16777216"});
}

TEST_F(IdxTest, DeclaredSizeAboveTheLimit_IsRejectedBeforeInflating) {
  const fs::path p = write_gz("big.gz", images_bytes(4, 8, 8));  // 256 bytes of data
  expect_invalid([&] { read_idx_images(p, /*max_bytes=*/255); },
                 {p.string(), "4 x 8 x 8 = 256 bytes", "limit of 255"});
  EXPECT_EQ(read_idx_images(p, 256).pixels.size(), 256u);
}

long peak_rss_kb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

// A gzip bomb: a valid small header followed by 64 MiB of zeros (compressing to ~64 KB). The
// reader stops inflating one byte past the declared 3 x 2 x 2 and reports trailing data.
TEST_F(IdxTest, GzipBomb_StopsAtTheDeclaredSize) {
  const fs::path p = dir_ / "bomb.gz";
  gzFile f = gzopen(p.c_str(), "wb9");
  ASSERT_NE(f, nullptr);
  std::vector<uint8_t> header;
  put_be32(header, 0x803);
  put_be32(header, 3);
  put_be32(header, 2);
  put_be32(header, 2);
  gzwrite(f, header.data(), static_cast<unsigned>(header.size()));
  const std::vector<uint8_t> zeros(1 << 20, 0);
  for (int i = 0; i < 64; ++i) gzwrite(f, zeros.data(), static_cast<unsigned>(zeros.size()));
  gzclose(f);
  ASSERT_LT(fs::file_size(p), 1u << 20);
  const long peak_before_kb = peak_rss_kb();
  expect_invalid([&] { read_idx_images(p); }, {p.string(), "trailing bytes after 28 bytes"});
  // Inflating the whole bomb would hold 64 MiB at once; stopping at the declared size does not.
  EXPECT_LT(peak_rss_kb() - peak_before_kb, 16 * 1024) << "peak resident memory grew (KiB)";
}

}  // namespace
}  // namespace hsgd::data
