#pragma once
// Fault injection for the multi-process tests (comm-internal): a process that should die inside
// a given collective, so that its peers are in that collective when it goes.
//
// HSGD_FAULT_KILL_IN_COLLECTIVE="TEXT#N[@L]": the N-th collective (counted from 1, N >= 1) whose
// description contains TEXT ("allreduce (535818 x float, sum) #12 'averager 8:4'") makes this
// process write one line naming it to stderr and SIGKILL itself as it starts to run. With @L only
// the worker of LOCAL_RANK L does. Only in a worker's first incarnation (HSGD_RESTART_COUNT unset
// or 0), so that the worker hsgd-run starts again trains on. Unset (the normal case): one getenv at
// the first call, nothing else. A malformed value throws hsgd::InvalidArgument naming it.

#include <string>

namespace hsgd::detail {

// Called by the collective queue as each collective starts, with its description.
void maybe_kill_in_collective(const std::string& description);

}  // namespace hsgd::detail
