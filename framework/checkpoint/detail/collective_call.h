#pragma once
// meet_in_call: the first step of Checkpointer::save and load, which are collective. A barrier
// named after the call ("Checkpointer::save(step 10)"): when the other ranks do not join it
// (the habit `if (rank == 0) ckpt.save(step)`), the group's mismatch check
// (comm/process_group/process_group.h) fails it within seconds on every rank that waits in a
// collective, before anything was written, so no partial step directory is left. The error
// here names the call and the ranks that made it:
//   "Checkpointer::save(step 10) was called on rank 0 only; every rank must call it: ..."
// Ranks that left the group (ProcessGroup::shutdown) or exited are found as quickly; ranks
// that are alive but in no collective (still computing) are only found at the group's timeout.
//
// Usage:
//   detail::meet_in_call(*pg, "Checkpointer::save(step 10)");

#include <string>

#include "comm/process_group/process_group.h"

namespace hsgd::checkpoint::detail {

// Collective over pg; returns at once for a group of one. Throws comm::CollectiveMismatch (the
// call was made on some ranks only) or the group's hsgd::CommError / hsgd::Timeout, each
// naming `call`.
void meet_in_call(comm::ProcessGroup& pg, const std::string& call);

}  // namespace hsgd::checkpoint::detail
