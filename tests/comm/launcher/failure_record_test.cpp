// FailureRecord: the encoding agents publish in the store, and from_store(), which turns
// anything found under a failed key into a record and never throws.

#include "comm/launcher/failure_record.h"

#include <gtest/gtest.h>

#include <string>

namespace hsgd::comm::launcher {
namespace {

TEST(FailureRecordTest, FromStore_ParsesGoodRecordsAndNeverThrows) {
  const FailureRecord good{
      .kind = FailureRecord::Kind::kFatal, .node_rank = 2, .rank = 9, .message = "boom\nline 2"};
  const auto parsed = FailureRecord::from_store(good.encode(), 4);
  EXPECT_EQ(parsed.kind, FailureRecord::Kind::kFatal);
  EXPECT_EQ(parsed.rank, 9);
  EXPECT_EQ(parsed.message, "boom\nline 2");
  for (const char* bad : {"", "7\n0\n0\n0\nkind out of range", "x\ny\nz\nw\n", "0\n0\n0"}) {
    const auto failure = FailureRecord::from_store(bad, 4);
    EXPECT_EQ(failure.kind, FailureRecord::Kind::kWorkerFailed) << bad;
    EXPECT_NE(failure.message.find("attempt 4"), std::string::npos) << failure.message;
  }
}

}  // namespace
}  // namespace hsgd::comm::launcher
