#pragma once
// CollectiveWatchdog: finds, within seconds, the ranks of a group that are in different
// collectives (comm-internal; ProcessGroup owns one per group of more than one rank).
//
// Fast path: a collective that completes within the threshold (ProcessGroup::Options::
// mismatch_check, HSGD_MISMATCH_CHECK_MS, default 2 s) costs two short critical sections
// (begin/end) and no store traffic. The watchdog thread wakes every threshold / 4 and looks at
// the collective running now; only one that has waited longer than the threshold publishes its
// fingerprint under "<prefix>waiting/<rank>" ("seq|shape hash|describe()") and then reads the
// other members' keys (and the "<prefix>left/<rank>" keys that ProcessGroup::shutdown writes)
// every threshold / 4 until it completes; then the key is deleted. Each group has its own
// prefix, so subgroups are checked on their own.
//
// A mismatch, found by any rank that waits:
// - another member waits at the same sequence number with another shape hash (a different kind,
//   size, type, op or root, or a named_barrier of another name);
// - another member has waited, for at least the threshold, at a lower sequence number s whose
//   shape hash differs from that of this rank's own collective s, or at an s older than the
//   kHistory collectives this rank remembers (a rank that waits at s cannot meet one waiting at
//   s' != s: one of them already passed the other's collective). A member waiting at a lower s
//   with the same hash is a straggler in a collective this rank completed, not a mismatch: it
//   completes once its last messages arrive (TCP's retransmission backoff may hold them for
//   seconds after a lost link). A member waiting at a higher sequence number is left to that
//   member, which checks this rank against its own history and stores the report (below);
// - a member left the group (ProcessGroup::shutdown) before reaching this collective;
// - a member stored a report already (it found a mismatch first, aborted and left its
//   collective, deleting its key before this rank read it): this rank adopts that report.
// The rank that found it waits one more threshold for the others to publish, so that every rank
// builds its message from the same keys, and calls on_mismatch with the report (the same on
// every rank that reads the same keys): the ranks grouped by what they are in, the root cause
// first. The root cause is the smallest set of ranks in one collective (ties: the set with the
// lowest rank), so a rank-0-only call on 4 ranks reads "barrier #7 'Checkpointer::save(step 10)'
// was called on rank 0 only; ranks 1-3 are in allreduce (272 x float, sum) #7 'DDP bucket 0'".
// A member that is alive but not in a collective (still computing) publishes nothing and is not
// a mismatch: a slow rank is legal; the collective's own timeout still bounds that case. A
// collective that has waited kSilentNote x the threshold logs once, as a warning, which members
// published nothing (computing, waiting elsewhere, or unreachable: a lost link or host) and
// which wait in it too, so that a stall names the ranks it waits for long before the timeout.
//
// Usage (inside ProcessGroup; not compiled: uses its private members):
//   watchdog_ = std::make_unique<CollectiveWatchdog>(
//       CollectiveWatchdog::Config{.store = store, .key_prefix = prefix, .rank = 0, .size = 4,
//                                  .threshold = std::chrono::seconds(2), .group_name = "world"},
//       [this](const MismatchReport& r) { abort(r); });
//   watchdog_->begin(fp);   // by the thread that runs the collective
//   watchdog_->end();

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/process_group/detail/collective_fingerprint.h"
#include "comm/store/store.h"

namespace hsgd::detail {

// What the watchdog found: message names what every rank is in; same_ranks are the members
// (group ranks) in the same collective as this rank (this rank included).
struct MismatchReport {
  std::string message;
  std::vector<int> same_ranks;
};

// The report the first rank that found a mismatch in the group with this key prefix stored, as
// seen by `rank`; nullptr when none was stored. Never blocks. A rank whose collective failed
// because a peer aborted its connections after finding a mismatch reports this one.
std::shared_ptr<const MismatchReport> stored_mismatch(comm::Store& store,
                                                      const std::string& key_prefix, int rank);

class CollectiveWatchdog {
 public:
  // Thresholds a collective waits before the silent members are named in a warning.
  static constexpr int kSilentNote = 3;
  // How many of its own collectives a rank remembers to tell a straggler from a mismatch.
  static constexpr size_t kHistory = 64;
  struct Config {
    std::shared_ptr<comm::Store> store = nullptr;
    std::string key_prefix = "";
    int rank = 0;
    int size = 1;
    comm::Duration threshold = std::chrono::seconds(2);
    std::string group_name = "";
  };
  using OnMismatch = std::function<void(const MismatchReport& report)>;

  // Starts the watchdog thread. on_mismatch runs on it, at most once.
  CollectiveWatchdog(Config config, OnMismatch on_mismatch);
  // Stops the thread (within threshold / 4).
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // The collective fp (seq set) starts / ended on the calling thread. begin also remembers
  // fp's seq and shape hash among the last kHistory collectives.
  void begin(const CollectiveFingerprint& fp);
  void end();

  // The report once a mismatch was found (on_mismatch was called), else nullptr.
  std::shared_ptr<const MismatchReport> found() const;

  // The key a member writes when it leaves the group after its collective next_seq - 1.
  static std::string left_key(const std::string& key_prefix, int rank);

 private:
  struct Peer {  // what one member published
    bool waiting = false;
    uint64_t seq = 0;
    uint32_t hash = 0;
    std::string what;
    bool left = false;
    uint64_t left_seq = 0;  // the first seq it will never run
  };
  void loop();
  // While collective mine has waited past the threshold (for `waited`): publish it, read the
  // others, and on a mismatch settle, store the report and call on_mismatch_.
  void watch(const CollectiveFingerprint& mine, comm::Duration waited);
  // The warning about the members that published nothing, once per collective.
  void note_silent(const CollectiveFingerprint& mine, const std::vector<Peer>& peers,
                   comm::Duration waited);
  // Whether peers (as read now) show a mismatch with mine.
  bool conflicts(const CollectiveFingerprint& mine, const std::vector<Peer>& peers);
  // The shape hash of this rank's collective seq, or nullopt when it is not among the last
  // kHistory that began.
  std::optional<uint32_t> hash_at(uint64_t seq) const;
  std::vector<Peer> read_peers();
  // "<group index of each rank, -1 for none>\n<message>", the form stored for every rank.
  std::string describe(const CollectiveFingerprint& mine, const std::vector<Peer>& peers) const;

  const Config config_;
  const OnMismatch on_mismatch_;
  const comm::Duration poll_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;                        // guarded by mu_
  bool running_ = false;                         // a collective runs; guarded by mu_
  CollectiveFingerprint current_;                // guarded by mu_
  std::chrono::steady_clock::time_point since_;  // when current_ began; guarded by mu_
  std::shared_ptr<const MismatchReport> found_;  // guarded by mu_
  // The collectives that began, at index seq % kHistory (seqs start at 0 with the group, as its
  // watchdog does, so this needs no reset); guarded by mu_.
  struct Begun {
    bool valid = false;
    uint64_t seq = 0;
    uint32_t hash = 0;
  };
  std::array<Begun, kHistory> history_{};

  // Used by the watchdog thread only.
  bool published_ = false;
  uint64_t published_seq_ = 0;
  bool noted_ = false;  // note_silent logged for published_seq_
  // Per member: the other seq it was first seen waiting at, and when (when != epoch).
  struct OtherSeq {
    uint64_t seq = 0;
    std::chrono::steady_clock::time_point when{};
  };
  std::vector<OtherSeq> other_seq_;

  std::thread thread_;  // started last
};

}  // namespace hsgd::detail
