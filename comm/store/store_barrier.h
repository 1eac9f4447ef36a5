#pragma once
// store_barrier: a set of ranks meets through the store rather than through a collective, so it
// works before a group is connected (group creation), after its last collective (shutdown, the
// end of a test) and for agreeing on a setup (the two-level allreduce, shared memory).
//
// Protocol: rank r writes "<prefix><r>" (options.value, "1" by default) and waits until the keys
// of all `size` ranks exist. A prefix is used once: a second barrier under the same prefix
// returns at once, since the keys are still there (callers put a fresh name or counter in it).
//
// CONTRACT: every one of the `size` ranks calls it with the same prefix and size. Blocks until
// they all arrived, or throws hsgd::Timeout after `timeout` naming the ranks that did not
// arrive ("ranks [1, 3] (global [5, 7]) did not arrive within 500 ms"); store errors propagate.
//
// Usage (meet, then read what every rank wrote):
//   const bool ok = true;   // this rank's vote
//   const int size = 4;
//   hsgd::comm::store_barrier(*store, "job/pg/vote/", rank, size, std::chrono::seconds(30),
//                             {.value = hsgd::comm::to_bytes(ok ? "1" : "0")});
//   auto votes = store->multi_get(hsgd::comm::store_barrier_keys("job/pg/vote/", size),
//                                 std::chrono::seconds(30));

#include <span>
#include <string>
#include <vector>

#include "comm/store/store.h"

namespace hsgd::comm {

struct StoreBarrierOptions {
  Bytes value = to_bytes("1");  // what this rank writes under "<prefix><rank>"
  // Names the barrier in the timeout message, e.g. "ProcessGroup 'world' (rank 0 of 4)";
  // "" gives "store barrier '<prefix>' (rank r of size)".
  std::string what = "";
  // Global rank of each of the `size` ranks; when given, the message names the missing ranks'
  // global ranks too. Read during the call only.
  std::span<const int> global_ranks = {};
};

// Meets the other ranks of [0, size) under prefix (see the header comment). Throws
// hsgd::InvalidArgument unless 0 <= rank < size and global_ranks is empty or has size entries.
void store_barrier(Store& store, const std::string& prefix, int rank, int size, Duration timeout,
                   const StoreBarrierOptions& options = {});

// The keys "<prefix>0" .. "<prefix><size-1>" that store_barrier waits for.
std::vector<std::string> store_barrier_keys(const std::string& prefix, int size);

// The ranks in [0, size) whose key "<prefix><rank>" does not exist yet. Never blocks.
std::vector<int> store_barrier_missing(Store& store, const std::string& prefix, int size);

}  // namespace hsgd::comm
