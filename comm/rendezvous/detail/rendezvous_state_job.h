#pragma once
// The entries of a RendezvousState (rendezvous_state.h): a job's keys and its pending waits.
// Shared by the state's sources only: rendezvous_state.cpp (requests and jobs),
// rendezvous_state_limits.cpp (request limits and job quotas) and rendezvous_state_waiters.cpp
// (registering, waking, answering and expiring waits). Every field is guarded by
// RendezvousState::mu_.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/rendezvous/detail/rendezvous_state.h"

namespace hsgd::comm {

// The keys of the pending get/wait/multi_gets of a job that named the same keys in the same
// order and all want values (get, multi_get) or none (wait). Registered once in the waiter list
// of each missing key; `remaining` counts the lists it is still in. Once every key exists it is
// answered for all its waiters at once, and kept as the job's last answer.
struct RendezvousState::KeySet {
  std::vector<std::string> keys;     // as requested: multi_get answers in this order
  std::string wire;                  // the keys as encode_keys_wire writes them
  bool values = true;                // get, multi_get; false: wait
  size_t hash = 0;                   // of wire and values (key_set_hash)
  std::vector<std::string> missing;  // distinct keys it is registered on
  size_t remaining = 0;
  bool pending = false;       // in Job::pending and the waiter lists of its missing keys
  uint64_t deletes_seen = 0;  // Job::deletes when it last checked its keys
  size_t charged_bytes = 0;   // its share of Job::bytes while pending (its key copies)
  std::vector<std::shared_ptr<Waiter>> waiters;  // Waiter::index is the position here
  std::shared_ptr<const std::string> body;       // the encoded values, once answered (values)
};

// One pending get/wait/multi_get: a member of the KeySet of its keys, with its own id, deadline
// and connection.
struct RendezvousState::Waiter {
  std::string job;
  uint64_t id = 0;
  std::shared_ptr<KeySet> keys;  // null once it left (answered, timed out or dropped)
  size_t index = 0;              // in keys->waiters
  bool done = false;             // answered, timed out or dropped
  Reply reply;
  std::unique_ptr<asio::steady_timer> timer;
};

struct RendezvousState::Job {
  std::string id;
  std::unordered_map<std::string, std::string> values;
  // By missing key: the KeySets waiting for it.
  std::unordered_map<std::string, std::vector<std::shared_ptr<KeySet>>> waiters;
  // By KeySet::hash: every pending KeySet, so that a wait for the same keys joins its set.
  std::unordered_multimap<size_t, std::shared_ptr<KeySet>> pending;
  // The last KeySet answered; dropped by the next write or delete (store_value, erase_value),
  // so while it is here every one of its keys exists with the value it encoded.
  std::shared_ptr<KeySet> answered;
  uint64_t deletes = 0;  // keys deleted so far: a KeySet re-checks its keys only if this moved
  size_t bytes = 0;      // keys + values stored, plus the keys of pending KeySets
  size_t num_waiters = 0;
  std::unordered_map<std::string, std::string> owner_of;  // owned key -> its owner
};

// A client that named an owner in its Hello (rendezvous_state.h, "Owned keys"), in one job.
struct RendezvousState::Owner {
  size_t connections = 0;
  int64_t linger_ms = 0;                       // of its last OP_SET_OWNED
  std::unique_ptr<asio::steady_timer> expiry;  // set while no connection is open
};

namespace rendezvous_state_detail {

// An INVALID_ARGUMENT answer to request carrying error.
inline proto::Response invalid(const proto::Request& request, std::string error) {
  proto::Response response;
  response.set_id(request.id());
  response.set_status(proto::STATUS_INVALID_ARGUMENT);
  response.set_error(std::move(error));
  return response;
}

}  // namespace rendezvous_state_detail

}  // namespace hsgd::comm
