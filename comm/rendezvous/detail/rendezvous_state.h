#pragma once
// RendezvousState: the keys and pending waits of a RendezvousServer, independent of sockets.
// Internal to the server (comm/rendezvous/rendezvous_server.cpp); tested through it. Its sources:
// rendezvous_state.cpp (requests, jobs), rendezvous_state_limits.cpp (limits, quotas) and
// rendezvous_state_waiters.cpp (pending waits); rendezvous_state_job.h holds their entries.
//
// Keys live in one namespace per job id. A request that can be answered now is answered by the
// return value of handle(); a get/wait/multi_get whose keys are missing waits. Waits that name
// the same keys in the same order (all ranks of a job reading every rank's address) share one
// KeySet: it is registered once on each missing key, woken once per key written, and answered
// once, the values encoded once into a buffer that every one of its waiters' replies carries
// (RendezvousAnswer::shared). set/add/compare_set/multi_set wake the KeySets of the keys they
// write; a timer per waiter on its connection's executor answers TIMEOUT at its own deadline;
// drop() forgets the waiter of a connection that went away. Nothing polls. Until the job's next
// write or delete it also keeps its last answer (one reply's keys and values at most), so that
// the same request arriving after every key exists gets the same buffer.
//
// Owned keys (OP_SET_OWNED): a client that names an owner in its Hello may set keys that live as
// long as one of its connections is open (attach/detach count them), plus the linger of its
// last OP_SET_OWNED. When its last connection closes, a timer on that connection's executor
// deletes its owned keys after the linger, unless a connection of the owner opened meanwhile.
// Any other write or a delete of an owned key ends its ownership (it stays).
//
// Quotas: each job may hold at most max_keys_per_job keys, max_job_bytes bytes (keys + values +
// the keys of its pending waits, each KeySet's once) and max_waits_per_job pending waits; the
// server at most max_jobs jobs. A request that would go beyond is refused whole with
// INVALID_ARGUMENT naming the limit (requests that shrink a job are always allowed), so one job
// cannot grow the server without bound and other jobs are unaffected. A wait's timeout_ms is
// clamped to [0, kMaxWaitTimeoutMs], so no value overflows the clock.
//
// Thread-safe: one mutex guards everything (operations are tiny; the I/O is elsewhere). Replies
// of woken waiters are delivered through their callback while that mutex is held, so the
// callback must only queue work (post to a strand), never block or call back into the state.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "comm/rendezvous/detail/asio.h"
#include "comm/rendezvous/proto/rendezvous.pb.h"
#include "comm/rendezvous/rendezvous_server.h"

namespace hsgd::comm {

// One year: longer waits are clamped to it (a raw client may send up to 2^63 - 1 ms).
inline constexpr int64_t kMaxWaitTimeoutMs = int64_t{365} * 24 * 3600 * 1000;

struct RendezvousLimits {
  size_t max_key_bytes = 4096;
  size_t max_keys_per_request = 65536;
  size_t max_keys_per_job = 100000;
  size_t max_job_bytes = size_t{64} << 20;
  size_t max_waits_per_job = 10000;
  size_t max_jobs = 10000;
  RendezvousLimitNames names = {};  // how refusals name the limits
};

// An answer ready to encode: the frame's body is `response` serialized, then `shared` when set.
// shared holds serialized Response fields numbered above every field set in `response` (the
// values of a get/multi_get, encoded once for every waiter of the same keys; `response` holds
// the id only then), so that the body is byte for byte protobuf's encoding of the whole answer
// (encode_frame_head in comm/rendezvous/frame.h).
struct RendezvousAnswer {
  proto::Response response;
  std::shared_ptr<const std::string> shared;
};

class RendezvousState {
 public:
  using Reply = std::function<void(RendezvousAnswer)>;
  // A pending wait, and the keys it shares with the waits for the same keys
  // (rendezvous_state_job.h).
  struct Waiter;
  struct KeySet;

  // Result of handle(): exactly one of the two is set.
  struct Outcome {
    std::optional<RendezvousAnswer> answer;  // answer now
    std::shared_ptr<Waiter> waiter;          // answered later through the reply callback
  };

  explicit RendezvousState(RendezvousLimits limits);
  ~RendezvousState();

  RendezvousState(const RendezvousState&) = delete;
  RendezvousState& operator=(const RendezvousState&) = delete;

  // Executes request in job's namespace. Deadline timers of blocking requests run on executor;
  // reply is called (at most once) when a blocking request completes or times out.
  // owner is the connection's Hello owner ("" for none; OP_SET_OWNED is refused then).
  Outcome handle(const std::string& job, proto::Request& request,
                 const asio::any_io_executor& executor, Reply reply, const std::string& owner = {});

  // A get/wait/multi_get whose keys are given as their wire encoding: the request's keys fields
  // (3) exactly as encode_keys_wire writes them, which is how protobuf serializes them.
  struct BlockingRequest {
    uint64_t id = 0;
    proto::Op op = proto::OP_UNSPECIFIED;
    int64_t timeout_ms = 0;
    std::string_view keys_wire;
  };
  // Handles request like handle() when job holds a KeySet of exactly these keys (pending, or its
  // last answer): the keys of the thousands of waits of one rendezvous are parsed once, not once
  // per request. Returns std::nullopt otherwise (then parse the request and call handle()).
  std::optional<Outcome> handle_known_keys(const std::string& job, const BlockingRequest& request,
                                           const asio::any_io_executor& executor, Reply reply);
  // The keys as protobuf serializes a Request's keys field (tag, length, bytes per key).
  static std::string encode_keys_wire(const google::protobuf::RepeatedPtrField<std::string>& keys);

  // A connection of owner in job was opened / closed (nothing for an empty owner). detach of
  // the owner's last connection starts the expiry of its owned keys on executor.
  void attach(const std::string& job, const std::string& owner);
  void detach(const std::string& job, const std::string& owner,
              const asio::any_io_executor& executor);

  // Forgets a pending waiter (its connection closed): it will never be answered.
  void drop(const std::shared_ptr<Waiter>& waiter);

  // Drops every waiter and every key (server stop).
  void clear();

  // Deletes the keys of job (none of its clients is connected, so it has no waiters).
  void erase_job(const std::string& job_id);
  size_t num_jobs() const;

  // Number of waiters still pending, over all jobs. For tests.
  size_t num_waiters() const;

  // Random and never 0, chosen at construction: tells a reconnecting client whether the keys it
  // wrote are still here (the same state) or were lost with a server that was restarted.
  uint64_t instance() const { return instance_; }

 private:
  struct Job;
  struct Owner;

  std::optional<proto::Response> check_limits(const proto::Request& request) const;
  // Refuses a write that would take job over its key or byte quota; requires mu_.
  std::optional<proto::Response> check_quota(const std::string& job_id, const Job& job,
                                             const proto::Request& request) const;
  // Stores / erases one entry, keeping the job's byte count (and dropping its last answer);
  // requires mu_.
  static void store_value(Job& job, const std::string& key, std::string value);
  static bool erase_value(Job& job, const std::string& key);
  proto::Response execute(Job& job, proto::Request& request, const std::string& owner);
  // Deletes the keys job still has owned by owner; requires mu_.
  void expire_owned(const std::string& job_id, const std::string& owner);

  // Pending waits (rendezvous_state_waiters.cpp); all require mu_.
  // A get/wait/multi_get: answered now (every key exists), or a waiter in the KeySet of its keys.
  Outcome wait(Job& job, proto::Request& request, const asio::any_io_executor& executor,
               Reply reply);
  // The job's KeySet of exactly these keys: its last answer, or a pending one; null if none.
  std::shared_ptr<KeySet> find_key_set(const Job& job, size_t hash, bool values,
                                       std::string_view wire) const;
  // Answers request from set now when set is answered; else adds a waiter to set (registered
  // as a pending KeySet first when is_new), within the job's quotas.
  Outcome join(Job& job, const std::shared_ptr<KeySet>& set, bool is_new,
               const BlockingRequest& request, const asio::any_io_executor& executor, Reply reply);
  // Why a wait would take job over its quota of waits or bytes (charge: the bytes a new KeySet
  // adds, 0 for one joined), or std::nullopt.
  std::optional<std::string> check_wait_quota(const Job& job, size_t charge) const;
  // Registers set on its missing keys; returns false when none is missing.
  bool register_keys(Job& job, const std::shared_ptr<KeySet>& set);
  // Removes set from the waiter lists of its missing keys and from the pending KeySets, and
  // gives back its bytes.
  void unregister(Job& job, const std::shared_ptr<KeySet>& set);
  // Answers every waiter of set, whose keys all exist (values read now), once.
  void complete(Job& job, const std::shared_ptr<KeySet>& set);
  // Reads set's values and encodes them once (set->body); it becomes the job's last answer.
  void encode_answer(Job& job, const std::shared_ptr<KeySet>& set);
  // Wakes the KeySets waiting for key after it was written.
  void notify(Job& job, const std::string& key);
  void on_deadline(const std::shared_ptr<Waiter>& waiter);
  // Takes a waiter out of its KeySet (unregistering the set when it was the last) and out of the
  // counts.
  void leave(Job& job, Waiter& waiter);
  // Ends every pending wait of job without an answer (the job or the server goes away).
  static void end_waits(Job& job);

  // Constant after construction.
  const RendezvousLimits limits_;
  const uint64_t instance_;

  mutable std::mutex mu_;
  // Guarded by mu_.
  std::unordered_map<std::string, std::unique_ptr<Job>> jobs_;
  // By owner_key(job, owner): the owners with a connection open or owned keys awaiting expiry.
  std::unordered_map<std::string, Owner> owners_;
  size_t num_waiters_ = 0;
};

}  // namespace hsgd::comm
