#pragma once
// The entries of a RendezvousState (rendezvous_state.h): a job's keys and its pending waits.
// Shared by the state's sources only: rendezvous_state.cpp (requests and jobs),
// rendezvous_state_limits.cpp (request limits and job quotas) and rendezvous_state_waiters.cpp
// (registering, waking and expiring waits). Every field is guarded by RendezvousState::mu_.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/rendezvous/detail/rendezvous_state.h"

namespace hsgd::comm {

// A get/wait/multi_get whose keys were not all present. Registered in the waiter list of each
// missing key; `remaining` counts the lists it is still in.
struct RendezvousState::Waiter {
  std::string job;
  uint64_t id = 0;
  proto::Op op = proto::OP_UNSPECIFIED;
  std::vector<std::string> keys;     // as requested: multi_get answers in this order
  std::vector<std::string> missing;  // distinct keys it was registered on
  size_t remaining = 0;
  bool done = false;          // answered, timed out or dropped
  uint64_t deletes_seen = 0;  // Job::deletes when it last checked its keys
  size_t charged_bytes = 0;   // its share of Job::bytes while pending (its key copies)
  Reply reply;
  std::unique_ptr<asio::steady_timer> timer;
};

struct RendezvousState::Job {
  std::string id;
  std::unordered_map<std::string, std::string> values;
  std::unordered_map<std::string, std::vector<std::shared_ptr<Waiter>>> waiters;
  uint64_t deletes = 0;  // keys deleted so far: a waiter re-checks its keys only if this moved
  size_t bytes = 0;      // keys + values stored, plus the keys of pending waiters
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
