#pragma once
// AveragingLevel: the state and arithmetic of one level of a model averager with options beyond
// plain averaging (level_options.h), or of one fragment of a streaming level (fragments >= 2,
// fragments.h): its anchor, outer momentum, error-feedback residual and the averaging in flight.
// Internal to the averagers (ModelAverager decides when a level or fragment starts and
// completes; see averagers.h for the schedule).
//
// Notation, per rank: x is the flat vector (n,) of the averaged tensors (the parameters with a
// gradient, n_params values, then the option buffers), or of a fragment's part of them (its
// parameters, then the buffers in the last fragment); g the level's group size; mean_g the
// element-wise mean over the group; A the anchor; M the outer momentum buffer; k the level's
// merge_delay() (overlap_steps, or period / fragments for a fragmented level without overlap).
//
// START at step s (an averaging of this level):
//   - the level's first averaging when it keeps an anchor and has none yet (no previous
//     averaging): payload x / g, float32 (exactly plain averaging); on completion A := R.
//   - plain level (only overlap): payload x / g, float32 allreduce (sum).
//   - anchored level, kNone (or compressed with a group of one rank, where nothing crosses a node):
//     payload (A - x) / g, float32 allreduce (sum).
//   - anchored level, compressed: payload p = A - x; for the parameters D = its group mean with
//     float32 sums within each node and compressed values between nodes, rounded at the points
//     and with the error feedback (residual e (n_params,), kept by each node's leader) that
//     compressed_average.h states; for the buffers D = their exact group mean, a float32
//     allreduce beside it (rounded running statistics could leave a variance below zero).
//   D := the group mean of the payload. S := x (the snapshot) when k > 0.
// COMPLETE (at once when k == 0, else at step s + k, or earlier when the averager needs the level
// settled, see averagers.h):
//   - first averaging or plain level: R := D.
//   - anchored: for the parameters, torch.optim.SGD with gradient D on A, in float32:
//       with momentum m > 0: M := D at the first outer step, else M := m * M + D;
//                            G := nesterov ? D + m * M : M;        (m == 0: G := D)
//       A := A + (-lr) * G;
//     for the buffers A := A - D (plain averaging). Then R := A.
//   - merge: x := R                  when k == 0,
//            x := R + (x - S)        otherwise (x is now, k local steps after the snapshot).
//
// Error handling: a mismatch between x and the stored state (the set of parameters with a
// gradient changed) throws InvalidArgument naming the level and both sizes; collective failures
// throw the ProcessGroup's errors.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/process_group/process_group.h"
#include "framework/distributed/model_averaging/compressed_average.h"
#include "framework/distributed/model_averaging/level_options.h"
#include "framework/train/state_dict.h"

namespace hsgd::distributed::detail {

class AveragingLevel {
 public:
  // What one averaging put on this rank's link: issued at `start`, finished at `end` (seconds of
  // the steady clock), `bytes` sent.
  struct Transfer {
    double start = 0;
    double end = 0;
    int64_t bytes = 0;
  };

  // group: this rank's group at the level (null when it is not a member: never started then).
  // fragment: the fragment this object averages, or -1 for the whole model (messages only; it
  // is collective over group like the level, and only fragment -1 or 0 logs the level's
  // warnings).
  AveragingLevel(size_t index, LevelOptions options, std::shared_ptr<comm::ProcessGroup> group,
                 int64_t fragment = -1);
  // Waits (bounded by the group timeout) for a collective still in flight: it writes into this
  // object's buffers. Errors are swallowed here; call complete() to see them.
  ~AveragingLevel();
  AveragingLevel(const AveragingLevel&) = delete;
  AveragingLevel& operator=(const AveragingLevel&) = delete;

  const LevelOptions& options() const { return options_; }
  comm::ProcessGroup* group() const { return group_.get(); }
  bool plain() const { return is_plain(options_); }
  bool pending() const { return pending_.has_value(); }
  // Whether the level holds an anchor (an anchored level after its first averaging, or after
  // reset_anchor).
  bool has_anchor() const { return !anchor_.empty(); }
  // A (n,): the common value of the level's group after its last averaging (empty: none yet).
  std::span<const float> anchor() const { return anchor_; }
  // The step at which the pending averaging merges (valid when pending()).
  int64_t due_step() const { return pending_->due; }
  // The steps between a start and its merge (merge_delay(options())).
  int64_t delay() const { return delay_; }

  // Starts an averaging of x at step (see the file comment); the level must not be pending.
  // Returns the bytes this rank puts on the wire (its payload).
  int64_t start(int64_t step, std::span<const float> x, int64_t n_params);
  // Waits for the pending averaging's collective (the level must be pending); returns the
  // seconds it waited (0 when the result had arrived). complete() calls it too.
  double receive();
  // Waits for the pending averaging and merges it into x (same n as at start). Returns R, valid
  // until the next call of a non-const method.
  std::span<const float> complete(std::span<float> x);
  // A higher level set this level's group to the common value r: anchored levels take r as
  // their anchor (so their next pseudo-gradient is the local progress since r). The level must
  // not be pending.
  void reset_anchor(std::span<const float> r);
  // The same for part of this level's x: values [at, at + r.size()) (a fragment of a higher
  // level). An anchored level without an anchor yet keeps none (its first averaging sets it).
  void reset_anchor_part(std::span<const float> r, size_t at);
  // The transfer of the averaging received last, once (then nullopt until the next one). A
  // pending averaging restored by load() has none.
  std::optional<Transfer> take_transfer();

  // Adds "<prefix>anchor", "outer_momentum", "residual" and "pending.{start,due,n_params,first,
  // snapshot,mean}" (only those that exist). Receives a pending averaging first: a float32 one
  // only waits for its collective, which every rank of the group issued; a compressed one also
  // runs its last step within the node (compressed_average.h), so every rank of the group saves
  // at the same step (as checkpoints do).
  void save(StateDict& state, const std::string& prefix);
  // Adds "<prefix>anchor" and "<prefix>outer_momentum" (those that exist): the state of the
  // averagings that completed, never waiting for one in flight (whose collective may be broken);
  // and "<prefix>residual" when no averaging is pending (a ring in flight, or one that failed,
  // may have changed the residual halfway; then it is left out).
  void save_settled(StateDict& state, const std::string& prefix) const;
  // Replaces the state by what save() stored under prefix (missing entries: none). A collective
  // in flight is waited for and dropped.
  void load(const StateDict& state, const std::string& prefix);

 private:
  struct Pending {
    int64_t start = 0;
    int64_t due = 0;
    int64_t n_params = 0;
    bool first = false;                // the first averaging of an anchored level
    bool received = false;             // mean_ holds D
    std::vector<float> snapshot;       // (n,) x at the start; empty without overlap
    bool compressed = false;           // compressed_ averages the parameters' part
    std::shared_ptr<comm::Work> work;  // the float32 allreduce (of the buffers alone when
                                       // compressed); null when there is none
    Transfer transfer;                 // start and bytes at start(); end at receive()
  };

  bool anchored() const { return is_anchored(options_); }
  void check_size(const char* what, size_t expected, size_t got) const;
  void outer_step(std::span<const float> gradient);  // on anchor_[0, gradient.size())

  // Constant after construction.
  const size_t index_;
  const LevelOptions options_;
  const std::shared_ptr<comm::ProcessGroup> group_;
  const int64_t delay_;
  const std::string name_;  // "model averaging level 1" or "... level 1 fragment 2"

  std::vector<float> anchor_;    // (n,) A; empty before the first averaging
  std::vector<float> momentum_;  // (n_params,) M; empty before the first outer step
  std::vector<float> residual_;  // (n,) e (only a node leader's changes); empty before the first
                                 // compressed averaging
  std::optional<Pending> pending_;
  std::vector<float> mean_;           // (n,) the float32 payload, averaged in place; then D
  std::optional<Transfer> received_;  // see take_transfer()
  // Compressed levels of >= 2 ranks; declared last: its averaging in flight writes mean_ and
  // residual_, so it is destroyed (waited for) first.
  std::unique_ptr<CompressedAverage> compressed_;
};

}  // namespace hsgd::distributed::detail
