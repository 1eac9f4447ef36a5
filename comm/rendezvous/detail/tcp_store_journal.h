#pragma once
// TcpStoreJournal: what one TcpStore client wrote to its server, so that it can write it again
// to a server that was restarted (comm/rendezvous/tcp_store.h, "Re-publishing"). Internal to
// TcpStore; tested through it.
//
// Kept per key: the last value the client set (set, multi_set, a compare_set it won), or the
// sum of its add() deltas (its share of a counter; a key it set and then added to keeps the
// value the add returned). delete_key forgets the key. replay() turns it into requests: values
// in multi_set batches within the server's limits, counters as one add each, so that the
// counters of a job's clients sum up again on the new server, and keys last written by a
// compare_set it won as one compare_set each that only creates the key (first writer wins on the
// new server too: what another client wrote there meanwhile stays). Owned keys (set_owned) are
// replayed first, one OP_SET_OWNED each with its linger; replay_owned() gives them alone, for a
// server that is the same instance but may have expired them while the client had no
// connection.
//
// Thread-safe (one mutex).

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "comm/rendezvous/proto/rendezvous.pb.h"

namespace hsgd::comm {

class TcpStoreJournal {
 public:
  // Records what the successful request (answered by response) left on the server. Returns
  // whether the journal holds anything new to re-publish.
  bool record(const proto::Request& request, const proto::Response& response);

  // The requests that write the journal to an empty server; `keys` is how many keys they
  // carry. Batches stay within max_keys_per_request keys and max_frame_bytes bytes.
  struct Replay {
    std::vector<proto::Request> requests;
    size_t keys = 0;
  };
  Replay replay(uint64_t max_keys_per_request, uint64_t max_frame_bytes) const;
  Replay replay_owned() const;

 private:
  struct Written {
    bool counter = false;  // add() deltas (contribution), else a value
    std::string value;
    int64_t contribution = 0;
    bool won = false;       // last written by a compare_set this client won
    bool owned = false;     // set with OP_SET_OWNED
    int64_t linger_ms = 0;  // its linger, when owned
  };

  // One OP_SET_OWNED per owned key; requires mu_.
  void append_owned(Replay& out) const;

  mutable std::mutex mu_;
  std::map<std::string, Written> written_;  // guarded by mu_
};

}  // namespace hsgd::comm
