#include "comm/launcher/heartbeat.h"

#include <gtest/gtest.h>

#include "comm/error.h"
#include "comm/store/hash_store.h"

namespace hsgd::comm::launcher {
namespace {

using std::chrono::milliseconds;
using Clock = Heartbeat::Clock;

// Time is passed in explicitly, so these tests never sleep or depend on the machine's speed.
TEST(HeartbeatTest, SilentNode_IsReportedAfterTimeoutOnly) {
  HashStore store;
  Heartbeat a(store, "p/", 2, 0, milliseconds(100), milliseconds(1000));
  Heartbeat b(store, "p/", 2, 1, milliseconds(100), milliseconds(1000));
  auto t = Clock::now();
  a.beat(t);
  b.beat(t);
  // Both beat for a while: nobody is silent.
  for (int i = 1; i <= 20; ++i) {
    t += milliseconds(100);
    EXPECT_EQ(a.tick(t), -1) << "step " << i;
    EXPECT_EQ(b.tick(t), -1) << "step " << i;
  }
  // b stops beating: a reports node 1 once more than the timeout has passed, not before.
  const auto last_beat = t;
  int silent = -1;
  while (silent < 0 && t - last_beat < milliseconds(5000)) {
    t += milliseconds(100);
    silent = a.tick(t);
  }
  EXPECT_EQ(silent, 1);
  EXPECT_GT(t - last_beat, milliseconds(1000));
  EXPECT_LE(t - last_beat, milliseconds(1200));
}

// While the rendezvous server is away nobody can beat or read. The watcher's first read after
// the gap must not blame a node that has not beaten again yet; a node that stays silent is
// reported a full timeout after the gap.
TEST(HeartbeatTest, GapInOwnReads_RestartsTheSilenceClock) {
  HashStore store;
  Heartbeat a(store, "p/", 2, 0, milliseconds(100), milliseconds(1000));
  Heartbeat b(store, "p/", 2, 1, milliseconds(100), milliseconds(1000));
  auto t = Clock::now();
  a.beat(t);
  b.beat(t);
  for (int i = 1; i <= 5; ++i) {
    t += milliseconds(100);
    ASSERT_EQ(a.tick(t), -1);
    ASSERT_EQ(b.tick(t), -1);
  }
  t += milliseconds(5000);  // the outage: no tick from anybody
  EXPECT_EQ(a.tick(t), -1) << "node 1 blamed for the time node 0 could not look";
  const auto back = t;
  int silent = -1;
  while (silent < 0 && t - back < milliseconds(5000)) {
    t += milliseconds(100);
    silent = a.tick(t);
  }
  EXPECT_EQ(silent, 1) << "a node that stays silent after the gap must still be reported";
  EXPECT_GT(t - back, milliseconds(1000));
  EXPECT_LE(t - back, milliseconds(1200));
}

// silent_for: how long a member has not beaten as of the last read, from well before its timeout
// (what the elastic agents use once a collective failed), zero for a member that beats.
TEST(HeartbeatBoardTest, SilentFor_GrowsFromTheLastChangeSeen) {
  HashStore store;
  HeartbeatBoard a(store, "p/", "a", milliseconds(100), milliseconds(10000));
  HeartbeatBoard b(store, "p/", "b", milliseconds(100), milliseconds(10000));
  auto t = Clock::now();
  a.beat(t);
  b.beat(t);
  EXPECT_EQ(a.silent_for("b", t), milliseconds(0)) << "never watched";
  for (int i = 1; i <= 5; ++i) {
    t += milliseconds(100);
    a.tick(t, {"a", "b"});
    b.tick(t, {"a", "b"});
  }
  EXPECT_EQ(a.silent_for("b", t), milliseconds(0));
  const auto last_beat = t;
  for (int i = 1; i <= 30; ++i) {
    t += milliseconds(100);
    EXPECT_TRUE(a.tick(t, {"a", "b"}).empty()) << "reported before its timeout, step " << i;
  }
  // Counted from the first read that saw b's last count: within one interval after it was written.
  const auto silent = a.silent_for("b", t);
  EXPECT_LE(silent, t - last_beat);
  EXPECT_GE(silent, t - last_beat - milliseconds(100));
  EXPECT_EQ(a.silent_for("b", t + milliseconds(50)), silent + milliseconds(50));
  // This agent could not read for longer than two intervals (the server was away): nobody is
  // silent for that time.
  EXPECT_EQ(a.silent_for("b", t + milliseconds(250)), milliseconds(0));
  // b beats again: its silence ends at the next read.
  b.beat(t);
  t += milliseconds(100);
  a.tick(t, {"a", "b"});
  EXPECT_EQ(a.silent_for("b", t), milliseconds(0));
}

TEST(HeartbeatTest, SingleNode_NeverSilent) {
  HashStore store;
  Heartbeat a(store, "p/", 1, 0, milliseconds(100), milliseconds(200));
  auto t = Clock::now();
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.tick(t += milliseconds(100)), -1);
}

TEST(HeartbeatTest, RejectsTimeoutNotAboveInterval) {
  HashStore store;
  EXPECT_THROW(Heartbeat(store, "p/", 2, 0, milliseconds(100), milliseconds(100)), InvalidArgument);
  EXPECT_THROW(Heartbeat(store, "p/", 2, 2, milliseconds(100), milliseconds(1000)),
               InvalidArgument);
}

}  // namespace
}  // namespace hsgd::comm::launcher
