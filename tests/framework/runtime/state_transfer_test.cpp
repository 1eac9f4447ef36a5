// The state transfer of an elastic join (framework/runtime/detail/state_transfer.h): the state
// arrives whole on every rank, and a receiver refuses bytes that are short or do not match what
// the root said it sent, before anything is restored, naming the root and the lengths.

#include "framework/runtime/detail/state_transfer.h"

#include <gtest/gtest.h>

#include <string>

#include "comm/error.h"
#include "framework/checkpoint/checkpoint_file.h"
#include "framework/tensor/tensor.h"
#include "tests/support/world.h"

namespace hsgd::runtime::detail {
namespace {

StateDict sample_state() {
  StateDict s;
  s.set("step", int64_t{42});
  s.set("model.weight", from_vector({1.5f, -2.0f, 3.25f, 0.0f}, {2, 2}));
  return s;
}

struct Sent {
  std::string bytes;
  TransferHeader header;
};

Sent encoded(const StateDict& state) {
  Sent sent;
  sent.bytes = checkpoint::encode_state(0, 42, state).SerializeAsString();
  sent.header = {.length = static_cast<int64_t>(sent.bytes.size()),
                 .crc32 = static_cast<int64_t>(checkpoint::crc32_of(sent.bytes))};
  return sent;
}

TEST(StateTransferTest, IntactBytes_DecodeToTheSentState) {
  const Sent sent = encoded(sample_state());
  const StateDict got = decode_transferred(sent.bytes, sent.header, 0, "the elastic state");
  EXPECT_EQ(got.get_int("step"), 42);
  EXPECT_EQ(got.get_tensor("model.weight").to_vector(),
            (std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f}));
}

TEST(StateTransferTest, AFlippedByte_IsRefusedAsCorrupt) {
  Sent sent = encoded(sample_state());
  sent.bytes[sent.bytes.size() / 2] ^= 0x10;
  try {
    decode_transferred(sent.bytes, sent.header, 3, "the elastic state");
    FAIL() << "a corrupt transfer was accepted";
  } catch (const CommError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the elastic state from rank 3 is corrupt"), std::string::npos) << m;
    EXPECT_NE(m.find("nothing was restored"), std::string::npos) << m;
  }
}

TEST(StateTransferTest, AShortTransfer_IsRefusedNamingBothLengths) {
  Sent sent = encoded(sample_state());
  const size_t full = sent.bytes.size();
  sent.bytes.resize(full - 5);
  try {
    decode_transferred(sent.bytes, sent.header, 1, "the elastic state");
    FAIL() << "a short transfer was accepted";
  } catch (const CommError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(std::to_string(full - 5) + " bytes"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(full) + " bytes"), std::string::npos) << m;
  }
}

// Over a real group of 3 ranks: every rank ends with the root's state.
TEST(StateTransferTest, Broadcast_GivesEveryRankTheRootsState) {
  auto result = testing::run_world(3, [](int rank, const auto& pg) {
    StateDict mine;
    if (rank == 1) mine = sample_state();
    int64_t bytes = 0;
    const StateDict got = broadcast_state(*pg, 1, 42, mine, "the elastic state", &bytes);
    EXPECT_GT(bytes, 0);
    EXPECT_EQ(got.get_int("step"), 42);
    EXPECT_EQ(got.get_tensor("model.weight").to_vector(),
              (std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f}));
  });
  EXPECT_RANKS_OK(result);
}

}  // namespace
}  // namespace hsgd::runtime::detail
