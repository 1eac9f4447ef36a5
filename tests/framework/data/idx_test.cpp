#include "framework/data/idx.h"

#include <gtest/gtest.h>
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

}  // namespace
}  // namespace hsgd::data
