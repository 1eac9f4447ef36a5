// framework/checkpoint/file_pieces: the streamed rank file is byte for byte what protobuf
// serializes (so the format is unchanged), for every kind of value and the edge cases of the
// wire format (defaults omitted, negative varints, empty and scalar tensors, views).

#include "framework/checkpoint/file_pieces.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>

#include "framework/checkpoint/checkpoint_file.h"
#include "framework/tensor/ops.h"
#include "tests/support/multiprocess.h"

namespace hsgd::checkpoint {
namespace {

namespace fs = std::filesystem;

// What the writer did before file_pieces: protobuf all the way.
std::string protobuf_payload(int rank, int64_t step, const StateDict& state) {
  return encode_state(rank, step, state).SerializeAsString();
}

std::string protobuf_file(const std::string& kind, const std::string& payload) {
  proto::Envelope envelope;
  envelope.set_kind(kind);
  envelope.set_format_version(kFormatVersion);
  envelope.set_crc32(crc32_of(payload));
  envelope.set_payload_size(payload.size());
  envelope.set_payload(payload);
  return envelope.SerializeAsString();
}

// Reports the first differing byte.
void expect_same_bytes(const std::string& expected, const std::string& got) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(static_cast<int>(static_cast<unsigned char>(got[i])),
              static_cast<int>(static_cast<unsigned char>(expected[i])))
        << "byte " << i << " of " << got.size();
  }
}

StateDict every_kind_of_value() {
  Generator gen(3);
  StateDict s;
  s.set("model.fc1.weight", randn({7, 5}, gen));
  s.set("model.fc1.bias", randn({7}, gen));
  s.set("model.bn.num_batches_tracked", zeros({}));  // scalar: no shape field
  s.set("model.empty", zeros({0}));                  // no data field
  s.set("model.empty_2d", zeros({3, 0}));
  s.set("model.view", randn({4, 6}, gen).transpose(0, 1));  // not contiguous
  s.set("optimizer.param_groups.0.lr", 0.1);
  s.set("optimizer.zero_real", 0.0);  // a oneof member is written even when 0
  s.set("optimizer.negative_zero", -0.0);
  s.set("optimizer.nan", std::numeric_limits<double>::quiet_NaN());
  s.set("optimizer.zero_int", int64_t{0});
  s.set("optimizer.negative_int", int64_t{-5});  // 10-byte varint
  s.set("optimizer.big_int", std::numeric_limits<int64_t>::max());
  s.set("entries.empty_blob", std::string());
  s.set("entries.blob", std::string("\0\1\xff", 3));
  s.set("entries.long_blob", std::string(300, 'x'));  // 2-byte length
  s.set("", int64_t{1});                              // empty key: omitted
  return s;
}

TEST(FilePiecesTest, RankPayloadIsWhatProtobufSerializes) {
  const StateDict state = every_kind_of_value();
  for (int rank : {0, 1, 300}) {
    for (int64_t step : {int64_t{0}, int64_t{1}, int64_t{1} << 40}) {
      SCOPED_TRACE("rank " + std::to_string(rank) + " step " + std::to_string(step));
      expect_same_bytes(protobuf_payload(rank, step, state),
                        encode_rank_payload(rank, step, state).to_string());
    }
  }
  expect_same_bytes(protobuf_payload(2, 9, StateDict()),
                    encode_rank_payload(2, 9, StateDict()).to_string());
}

TEST(FilePiecesTest, EnvelopeIsWhatProtobufSerializes) {
  for (const std::string& payload : {std::string(), std::string("abc"), std::string(200, '\7')}) {
    FilePieces pieces;
    pieces.append_copy(payload);
    EXPECT_EQ(pieces.crc32(), crc32_of(payload));
    expect_same_bytes(protobuf_file(kRankKind, payload),
                      envelope_of(kRankKind, pieces, pieces.crc32()).to_string());
  }
}

TEST(FilePiecesTest, WrittenRankFileReadsBackAndEqualsTheProtobufFile) {
  const fs::path dir = testing::unique_temp_dir("file-pieces");
  // More tensors than one writev takes (IOV_MAX is 1024 on Linux).
  StateDict state = every_kind_of_value();
  Generator gen(5);
  for (int i = 0; i < 1500; ++i) state.set("model.t" + std::to_string(i), randn({3}, gen));
  const std::string path = (dir / "rank_1").string();
  const WrittenFile written = write_rank_file(path, 1, 42, state);

  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string payload = protobuf_payload(1, 42, state);
  expect_same_bytes(protobuf_file(kRankKind, payload), bytes);
  EXPECT_EQ(written.size, bytes.size());
  EXPECT_EQ(written.crc32, crc32_of(payload));

  uint32_t crc = 0;
  proto::RankState read;
  ASSERT_TRUE(read.ParseFromString(read_envelope(path, kRankKind, &crc)));
  EXPECT_EQ(crc, written.crc32);
  const StateDict back = decode_state(read, path);
  ASSERT_EQ(back.size(), state.size());
  EXPECT_EQ(back.get_tensor("model.view").to_vector(),
            state.get_tensor("model.view").contiguous().to_vector());
  EXPECT_EQ(back.get_int("optimizer.negative_int"), -5);
  EXPECT_EQ(back.get_bytes("entries.blob"), std::string("\0\1\xff", 3));
}

}  // namespace
}  // namespace hsgd::checkpoint
