#pragma once
// Preemption of a training run (the Runtime arms it when it writes checkpoints): SIGUSR1 or
// SIGTERM (forwarded by hsgd-run from Slurm's `--signal=B:USR1@60` through the batch script, or
// Slurm's SIGTERM before SIGKILL, or sent by hand) makes a run that writes checkpoints stop at a
// step boundary, after a checkpoint of that step on every rank, and exit
// comm::launcher::kExitPreempted (75). A run without checkpoints
// keeps the signals' default action (it dies of them).
//
// install_preemption_signals() blocks both signals in the calling thread and starts one thread
// that waits for them; call it before the program starts threads (run_main does), so they
// inherit the mask and their system calls are not interrupted by the signals. Threads started
// before main (OpenBLAS's pool) do not block them: there a handler (SA_RESTART) does the same as
// the waiting thread. While no
// PreemptionCheck is armed, that thread ends the process by the signal's default action, as if
// nothing had been installed. While one is armed, the first signal is recorded and later ones
// are ignored (Slurm signals the workers itself as well as through hsgd-run; a second signal
// must not cut the checkpoint short: hsgd-run's SIGKILL after --grace-period is the bound).
// Once a check has decided to stop, the process stays that way after the check is gone: it is
// on its way to exit 75, and a SIGTERM from an agent that learned of the preemption from
// another node must not turn that exit into a death by the signal.
//
// PreemptionCheck makes the ranks agree on the step: ranks receive the signal at different
// steps, and all must save the same one. At every step boundary each rank starts an allreduce
// (max) of "a signal arrived here" over the world, and the allreduce started `lag` boundaries
// earlier decides: a signal that reaches any rank before boundary k stops every rank at boundary
// k + lag (or at the end of the run if that comes first). The answer is usually complete by then,
// so the training thread only issues an 8-byte allreduce per step and waits for nothing; the
// ranks stay within `lag` steps of each other, which DDP's and the averagers' collectives require
// anyway at their own pace. Measured (train_mlp, 2 ranks on 2 shared cores, 2026-12-04, see
// docs/launcher.md): with lag 1 a rank of a local-SGD run spent 3-4 ms per step waiting for the
// other's flag; with lag 4, 0.03-0.3 ms. In a world of one the flag is read directly: the run
// stops at the next boundary. An unarmed check (no checkpoints) costs nothing.
//
// Usage:
//   PreemptionCheck preemption(world, /*armed=*/true);
//   int64_t step = 0;
//   for (const data::Batch& batch : loader) {
//     // ... one training step on batch ...
//     ++step;
//     if (preemption.stop_now()) break;  // the same answer on every rank
//   }
//   preemption.finish();

#include <csignal>
#include <cstdint>
#include <deque>
#include <memory>

#include "comm/process_group/process_group.h"
#include "comm/process_group/work.h"

namespace hsgd::runtime {

// Idempotent; see the file comment. Throws hsgd::Error when the signal mask cannot be set.
void install_preemption_signals();

// The signal recorded while a check was armed, 0 if none.
int preemption_signal();

class PreemptionCheck {
 public:
  // armed: the run can write a checkpoint, so a signal is recorded instead of ending the process.
  // world: the ranks that must agree (all of the run). lag: steps from a flag to its decision
  // (>= 1; hsgd::InvalidArgument otherwise).
  static constexpr int kDefaultLag = 4;
  PreemptionCheck(std::shared_ptr<comm::ProcessGroup> world, bool armed, int lag = kDefaultLag);
  // Disarms; waits for an allreduce in flight (its errors are logged, not thrown).
  ~PreemptionCheck();
  PreemptionCheck(const PreemptionCheck&) = delete;
  PreemptionCheck& operator=(const PreemptionCheck&) = delete;

  // Call at every step boundary, on every rank of the world: true when every rank is to stop
  // now (the same answer on all ranks). Always false when not armed.
  bool stop_now();
  // Waits for the allreduce in flight (collective errors are thrown here); call when the loop
  // ends without stopping, before the world group is shut down.
  void finish();

 private:
  const std::shared_ptr<comm::ProcessGroup> world_;
  const bool armed_;
  const int lag_;
  struct Pending {
    double flag = 0;  // the allreduce's buffer, alive until work completed
    std::shared_ptr<comm::Work> work;
  };
  std::deque<Pending> pending_;  // oldest first, at most lag_
  // Time spent in stop_now() (logged at debug level by the destructor).
  int64_t checks_ = 0;
  double seconds_ = 0;
};

}  // namespace hsgd::runtime
