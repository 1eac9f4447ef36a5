#pragma once
// The exit codes by which a worker tells its launch agent how it ended, beyond success (0) and
// failure (any other code, or a signal), which the agent answers with a restart while its budget
// lasts. The agent passes these two on as its own exit code, so a batch script can act on them.
//
// Usage (a worker's main):
//   bool preempted = false;  // set at a step boundary after the agent forwarded SIGUSR1
//   int code = preempted ? hsgd::comm::launcher::kExitPreempted : 0;

namespace hsgd::comm::launcher {

// The job was asked to stop (a preemption signal: SIGUSR1 or SIGTERM forwarded by the agent),
// wrote a checkpoint at a step boundary on every rank and stopped cleanly. The agent does not
// restart; a resubmitted or requeued job resumes from that checkpoint. 75 is EX_TEMPFAIL of
// sysexits.h: "try again later".
inline constexpr int kExitPreempted = 75;

// The worker failed in a way that a restart would repeat (the checkpoint directory's disk is
// full, the configuration is refused). The agent stops the job without spending its restarts.
// 78 is EX_CONFIG of sysexits.h.
inline constexpr int kExitWillRepeat = 78;

}  // namespace hsgd::comm::launcher
