#pragma once
// RendezvousState: the keys and pending waits of a RendezvousServer, independent of sockets.
// Internal to the server (comm/rendezvous/rendezvous_server.cpp); tested through it. Its sources:
// rendezvous_state.cpp (requests, jobs), rendezvous_state_limits.cpp (limits, quotas) and
// rendezvous_state_waiters.cpp (pending waits); rendezvous_state_job.h holds their entries.
//
// Keys live in one namespace per job id. A request that can be answered now is answered by the
// return value of handle(); a get/wait/multi_get whose keys are missing registers a Waiter on
// each missing key. set/add/compare_set/multi_set wake the waiters of the keys they write; a
// timer on the connection's executor answers TIMEOUT at the deadline; drop() forgets the
// waiter of a connection that went away. Nothing polls.
//
// Owned keys (OP_SET_OWNED): a client that names an owner in its Hello may set keys that live as
// long as one of its connections is open (attach/detach count them), plus the linger of its
// last OP_SET_OWNED. When its last connection closes, a timer on that connection's executor
// deletes its owned keys after the linger, unless a connection of the owner opened meanwhile.
// Any other write or a delete of an owned key ends its ownership (it stays).
//
// Quotas: each job may hold at most max_keys_per_job keys, max_job_bytes bytes (keys + values +
// the keys of its pending waits) and max_waits_per_job pending waits; the server at most
// max_jobs jobs. A request that would go beyond is refused whole with INVALID_ARGUMENT naming
// the limit (requests that shrink a job are always allowed), so one job cannot grow the server
// without bound and other jobs are unaffected. A wait's timeout_ms is clamped to
// [0, kMaxWaitTimeoutMs], so no value overflows the clock.
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

class RendezvousState {
 public:
  using Reply = std::function<void(proto::Response)>;
  struct Waiter;

  // Result of handle(): exactly one of the two is set.
  struct Outcome {
    std::optional<proto::Response> response;  // answer now
    std::shared_ptr<Waiter> waiter;           // answered later through the reply callback
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
  // Stores / erases one entry, keeping the job's byte count; requires mu_.
  static void store_value(Job& job, const std::string& key, std::string value);
  static bool erase_value(Job& job, const std::string& key);
  // Forgets a waiter's share of its job's quotas; requires mu_.
  void release(Job& job, Waiter& waiter);
  proto::Response execute(Job& job, proto::Request& request, const std::string& owner);
  // Deletes the keys job still has owned by owner; requires mu_.
  void expire_owned(const std::string& job_id, const std::string& owner);
  // Registers the waiter on its missing keys; returns false when none is missing.
  bool register_waiter(Job& job, const std::shared_ptr<Waiter>& waiter);
  // Answers a waiter whose keys all exist (values read now); requires mu_.
  void complete(Job& job, const std::shared_ptr<Waiter>& waiter);
  // Wakes the waiters of key after it was written; requires mu_.
  void notify(Job& job, const std::string& key);
  void on_deadline(const std::shared_ptr<Waiter>& waiter);
  // Removes waiter from the waiter lists of its missing keys; requires mu_.
  void unregister(Job& job, const Waiter& waiter);

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
