#pragma once
// Model averagers: run after optimizer.step() to average the model over a process group
// periodically (post-local SGD, arXiv 1808.07217), like torch's
// torch.distributed.algorithms.model_averaging.averagers.
//
// Contract shared by every averager:
// - average_parameters() is called once per training step on every rank of the group. It
//   averages only when the averager's schedule says so, and advances step() on EVERY call.
// - Parameters whose grad() is undefined are skipped (they did not train this step).
// - One persistent flat buffer per averager and one allreduce per averaging: after the first
//   averaging of a given model, no memory is allocated.
// - Construction is collective over the group: the ranks exchange their configuration (an
//   allgather of a few integers) and throw hsgd::InvalidArgument on every rank when they
//   disagree or when it is invalid, instead of hanging later or averaging the wrong groups.
//   They also compare the shapes of options.average_buffers, and at the first averaging the
//   shapes of everything they average, across the whole group (replica_check.h: one small
//   allgather, once), so that a model that differs between ranks fails with a message naming
//   the first differing tensor instead of aborting inside Gloo or mixing unrelated weights.
// - Beyond torch: options.average_buffers are averaged with the parameters (BatchNorm running
//   statistics); level_stats() counts, per level, the averagings, payload bytes and seconds.
// - Beyond torch: each level may take LevelOptions (level_options.h): an outer optimizer
//   (DiLoCo), overlap with the next steps, 16-, 8- or 4-bit compression, streaming in fragments.
//   The constructors without LevelOptions build plain levels, which average exactly as before (bit
//   for bit).
//
// Schedule of levels with options (the arithmetic of one level is in averaging_level.h). A level
// with fragments = F >= 2 (streaming) is F units, one per fragment (fragments.h: whole parameter
// tensors, balanced bytes, the option buffers in the last); any other level is one unit over the
// whole model. Unit f of a level of period H starts at the steps of offset o_f = f * H / F within
// the period: PeriodicModelAverager at step >= warmup_steps with (step - warmup_steps - o_f) % H
// == 0; HierarchicalModelAverager at step >= warmup_steps with step % H == o_f when no level
// above averages at that step (for o_0 = 0 that is the level's usual step; a level above
// averages the whole model over a larger group, which makes the fragment redundant). Each unit
// merges merge_delay() steps after its start (level_options.h: overlap_steps, or H / F for a
// fragmented level without overlap). At each call, in this order:
//   1. every pending averaging whose due step (start + delay) is <= step completes, lowest level
//      first, fragments in order;
//   2. for each unit starting at this step, lowest level first, fragments in order: every
//      pending averaging of a lower level completes first, and so does the unit's own previous
//      one (an overlap reaching past the unit's next start is waited for then; a higher level
//      never averages over a lower level's half-merged state); then the unit starts, and
//      completes at once when its delay is 0. Other fragments of its level in flight stay in
//      flight: that is the streaming.
// Whenever a unit of level L completes (with result R over its part of the model, identical on
// every member of its group), pending averagings of the levels below complete first, and then
// the anchored levels below take R as their anchor on that part (an anchored unit below that
// has no anchor yet and is covered only in part keeps none): their next pseudo-gradient is the
// local progress since L's result, not L's own move. Collectives are issued in this order on
// every rank, which the contract of ProcessGroup requires; waiting only ever waits for
// collectives every member has already issued.
// A pending averaging still in flight at the end of training is merged by finish_pending().
//
// Usage (post-local SGD: DDP with post_localSGD_hook for 100 steps, then average every 4):
//   auto averager = std::make_shared<hsgd::distributed::PeriodicModelAverager>(4, 100, pg);
//   for (const hsgd::data::Batch& batch : loader) {
//     optimizer->zero_grad();
//     hsgd::nn::cross_entropy(model->forward(batch.inputs), batch.targets).backward();
//     optimizer->step();
//     averager->average_parameters(model->parameters());
//   }
// or wrap the optimizer in optim::PostLocalSGDOptimizer, or let runtime::Runtime build the
// averagers (ParallelOptions).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group/process_group.h"
#include "framework/distributed/model_averaging/fragments.h"
#include "framework/distributed/model_averaging/level_options.h"
#include "framework/distributed/model_averaging/link_peak.h"
#include "framework/distributed/model_averaging/utils.h"
#include "framework/tensor/tensor.h"
#include "framework/train/optimizer.h"

namespace hsgd::distributed {
namespace detail {
class AveragingLevel;
class CompressedAverage;
}  // namespace detail

struct ModelAveragerOptions {
  // Tensors averaged together with the parameters at every averaging (in the same allreduce),
  // e.g. model->buffers() for BatchNorm running statistics. Same order on every rank.
  std::vector<Tensor> average_buffers;
};

// What one level of averaging has cost so far (PeriodicModelAverager has one level).
struct AveragingLevelStats {
  int64_t period = 0;
  int group_size = 0;  // ranks of this rank's group at the level (a node level: its node's)
  // Averagings run (started) at this level; with fragments, each fragment's averaging counts
  // one, so bytes / calls is what one averaging puts on the link.
  int64_t calls = 0;
  // This rank's payload on the wire, summed over calls: 4 bytes per averaged element in float32.
  // Compressed averagings count what this rank sends between nodes (compressed_average.h): a
  // node leader about 4 (N - 1) / N bytes per element for N nodes, the other members 0.
  int64_t bytes = 0;
  // Wall time the training thread spent inside averaging (pack, allreduce, unpack; with overlap:
  // starting, then waiting and merging, not the time the collective ran in the background).
  double seconds = 0.0;
  // Of `seconds`: the time the training thread waited for overlapped averagings (overlap_steps
  // > 0) that had not arrived by the step they merged at. Zero when the overlap hid the
  // collective: its computation window (overlap_steps steps) was at least its transfer time.
  double overlap_wait_seconds = 0.0;
  // The busiest 100 ms of the level's link on this rank: the most bytes of `bytes` that fall into
  // any 100 ms window, each collective's bytes spread uniformly from its issue to its end
  // (link_peak.h), per second. Streaming (fragments) lowers it: the same bytes spread over the
  // period.
  double peak_bytes_per_second = 0.0;
};

// Base class.
class ModelAverager {
 public:
  ModelAverager(const ModelAverager&) = delete;
  ModelAverager& operator=(const ModelAverager&) = delete;
  // Waits for averagings still in flight (bounded by the group timeout) without merging them.
  virtual ~ModelAverager();

  // Averages params if the schedule says so at the current step; then step() += 1.
  virtual void average_parameters(const std::vector<Tensor>& params) = 0;
  // Same over the parameters of the optimizer's param groups.
  void average_parameters(const std::vector<ParamGroup>& groups);

  // The parameters every rank starts from, when they are the same on every rank (as after
  // DDP's broadcast at construction). Compressed levels without an outer optimizer take them as
  // their anchor, so that their first averaging already sends compressed differences instead of
  // float32 parameters; its result is the same mean up to the rounding every later averaging
  // has. Call it on every rank before the first average_parameters (params as that call will
  // get them; the buffers are ModelAveragerOptions::average_buffers). Collective over the
  // process group: an allgather of a 64-bit fingerprint of the values. Returns whether they were
  // kept (the levels take them at the first averaging of the parameters with a gradient); false
  // (nothing changed) when no level takes them, an averaging already ran, or the ranks' values
  // differ. Throws the allgather's errors.
  bool start_from(const std::vector<Tensor>& params);

  // Sets what the averager averages (the parameters with a gradient among params, or all of them
  // when none has one, as after a resume; then the option buffers) to its mean over the whole
  // process group, with the top level's compression between nodes: each rank contributes its
  // difference from the top level's anchor A (the level's common value after its last
  // averaging, per fragment), compressed_average.h averages
  // them to D (float32 sums within a node, the level's format between nodes, no error feedback)
  // and every rank sets A - D, the same bits on every rank: the mean up to the rounding of one
  // averaging of the level. For an evaluation of the replicas' average (AveragedReplicas takes
  // it): on the link about the level's own bytes instead of float32's. The levels' state
  // (anchors, residuals, averagings in flight) is unchanged, so training may go on from the
  // local values afterwards.
  // Collective over the process group (call it on every rank at the same point, params as
  // average_parameters gets them); the first call that compresses makes the node and leader
  // groups it uses. Returns the tensors it set, or an empty vector when it sent and changed
  // nothing: the top level does not compress, its group lies on one node, or some fragment of
  // it has no anchor yet (no averaging and no start_from), or the tensors are not those the
  // level averages (their sizes differ from its anchors'). The result depends only on the
  // values, the anchors (state_dict() holds them) and the node layout, so a resumed run computes
  // the same bits. Throws the collectives' errors.
  std::vector<Tensor> average_replicas(const std::vector<Tensor>& params);

  // Number of average_parameters calls so far (restored from checkpoints by
  // PostLocalSGDOptimizer::load_state_dict).
  int64_t step() const { return step_; }
  void set_step(int64_t step);

  const std::vector<AveragingLevelStats>& level_stats() const { return stats_; }
  // The options of each level (plain for the constructors without LevelOptions).
  const std::vector<LevelOptions>& level_options() const { return level_options_; }
  // Whether an overlapped averaging is in flight (started, not merged yet).
  bool has_pending() const;
  // Waits for and merges every pending averaging into params now, lowest level first, as if its
  // due step had come (call it on every rank at the same step, e.g. before the final
  // evaluation; pass what average_parameters is given). No-op without pending averagings.
  // Throws the collectives' errors.
  void finish_pending(const std::vector<Tensor>& params);
  void finish_pending(const std::vector<ParamGroup>& groups);
  // Whether the last average_parameters call averaged over the whole process group, so that
  // every replica's parameters are equal now (never for a fragmented level, which averages part
  // of the model at a time) (a checkpoint then may resume on another world
  // size; see framework/checkpoint/checkpointer.h).
  bool averaged_whole_group_last_step() const { return whole_group_step_ == step_ - 1; }
  // Whether the last average_parameters call started an averaging over the whole process group,
  // completed at once or in flight (overlap_steps > 0). With an overlapped one in flight, a
  // finish_pending() right after this call leaves every replica's parameters equal (the group's
  // result: no local step since the snapshot), as if the averaging had not overlapped.
  bool started_whole_group_averaging_last_step() const {
    return whole_group_start_step_ == step_ - 1;
  }
  // Whether the last average_parameters call started the period of a fragmented level over the
  // whole process group (its fragment 0). Such a level never leaves the replicas equal (its
  // fragments average at different steps); its period starts are where a program that needs
  // equal replicas (an elastic join) averages them itself.
  bool started_streaming_whole_group_period_last_step() const {
    return streaming_period_start_step_ == step_ - 1;
  }

  // For checkpoints: "step" (int64) and per level i "levels.<i>.{calls,bytes}" (int64) and
  // "levels.<i>.{seconds,overlap_wait_seconds,peak_bytes_per_second}" (double), so level_stats()
  // keep counting across a resume; and the state of the level options, when it exists:
  // "levels.<i>.anchor", "levels.<i>.outer_momentum", "levels.<i>.residual" (flat float tensors)
  // and, for an averaging in flight, "levels.<i>.pending.{start,due,n_params,first}" (int64) with
  // "levels.<i>.pending.mean" (the group mean D it received: state_dict() waits for it) and
  // "levels.<i>.pending.snapshot". A level with fragments >= 2 keeps the same entries per
  // fragment f under "levels.<i>.fragments.<f>." instead (a state without them starts the
  // fragments afresh). A resumed averager thus merges at the same step with the same values.
  virtual StateDict state_dict() const;
  // "levels.<level>.anchor" and "levels.<level>.outer_momentum" (those that exist; per fragment
  // under "levels.<level>.fragments.<f>." for a fragmented level), as in
  // state_dict(), of the averagings that completed: never waits, so it may be called after the
  // group failed (an averaging in flight is left out). With no averaging of the level pending,
  // also this rank's "levels.<level>.residual" (error feedback; left out while one is pending,
  // whose ring may have changed it halfway). load_state_dict() takes it.
  StateDict settled_level_state(size_t level) const;
  // Restores what state_dict() stored; the level entries are optional (a state with only
  // "step", e.g. from PostLocalSGDOptimizer, restores the step). InvalidArgument when the state
  // has more levels than this averager; nothing is changed then.
  virtual void load_state_dict(const StateDict& state);
  const std::shared_ptr<comm::ProcessGroup>& process_group() const { return pg_; }

 protected:
  ModelAverager(std::shared_ptr<comm::ProcessGroup> pg, ModelAveragerOptions options,
                const char* class_name);

  // Averages the params with a gradient, plus the option buffers, over group and charges the
  // cost to level_stats()[level]. A null group (not a member) does nothing.
  void average_at_level(size_t level, const std::vector<Tensor>& params, comm::ProcessGroup* group);
  // Appends a level (its stats too); group is this rank's group at the level.
  void add_level(const LevelOptions& options, std::shared_ptr<comm::ProcessGroup> group);
  // One call of the schedule (see the file comment): `level` averages at step_ (-1: none), and
  // the fragments of fragmented levels whose fragment_starts() says so.
  // Plain levels without pending or anchored levels below take average_at_level, unchanged.
  // Does not advance step_. The first call checks the tensors (check_tensors_once).
  void average_step(int level, const std::vector<Tensor>& params);
  // Whether the fragment of `level` at `offset` (fragment_offset, > 0) within the level's
  // period starts at `step` (the file comment states the rule of each averager).
  virtual bool fragment_starts(size_t level, int64_t offset, int64_t step) const = 0;
  // Collective over pg_, once (the first call; later calls return at once): every rank averages
  // parameters and buffers of the same shapes. It runs before the first averaging starts, so
  // it never queues on pg_ behind an overlapped averaging in flight (a lower level's first
  // averaging would otherwise wait for the whole transfer of a higher one).
  void check_tensors_once(const std::vector<Tensor>& params);
  // The anchors of the levels start_from applies to, from start_values_ in the order of
  // tensors (pack's); once, then start_values_ is cleared.
  void take_start_values(const std::vector<Tensor>& tensors);
  // Collective over pg_: every rank passed average_buffers of the same shapes. Called by the
  // subclasses' constructors after their configuration check.
  void check_buffers_on_all_ranks();

  // Constant after construction.
  const std::shared_ptr<comm::ProcessGroup> pg_;
  const ModelAveragerOptions options_;
  const char* const class_name_;

  int64_t step_ = 0;
  int64_t whole_group_step_ = -1;        // the last step whose averaging covered the whole group
  int64_t whole_group_start_step_ = -1;  // the last step that started one (overlapped or not)
  int64_t streaming_period_start_step_ = -1;  // the last step that started a fragmented world
                                              // level's fragment 0
  std::vector<AveragingLevelStats> stats_;

 private:
  using Unit = std::unique_ptr<detail::AveragingLevel>;
  // Completes the pending averaging of fragment f of level (one unit: f = 0 for a level
  // without fragments) into x_, lower pending levels first, and resets the anchors of the
  // levels below on its part of x_.
  void complete_unit(size_t level, size_t f);
  // The anchored units of the levels below `level` take r, the common value of x_'s values
  // [at, at + r.size()), as their anchor there.
  void reset_anchors_below(size_t level, std::span<const float> r, size_t at);
  // Values [offset, offset + size) of x_ that unit f of level averages, and its parameters.
  detail::Fragment part(size_t level, size_t f) const;
  // Packs the averaged tensors into x_ (parameters with a gradient, then buffers) and splits it
  // into the fragments of the fragmented levels; returns the tensors.
  std::vector<Tensor> pack(const std::vector<Tensor>& params);
  // "levels.<level>." for a level without fragments, else "levels.<level>.fragments.<f>.".
  std::string unit_prefix(size_t level, size_t f) const;

  FlatAverager flat_;
  std::vector<LevelOptions> level_options_;
  std::vector<std::vector<Unit>> levels_;  // [level][fragment]: one unit without fragments
  std::vector<detail::LinkPeak> peaks_;    // per level
  std::vector<float> x_;                   // (n,) the averaged tensors, flat, during average_step
  int64_t n_params_ = 0;                   // of x_, the parameters with a gradient
  // The fragments of each level (empty for a level without fragments), split at the last pack
  // from param_sizes_ (the sizes of the parameters with a gradient) and n_buffers_.
  std::vector<std::vector<detail::Fragment>> fragments_;
  std::vector<int64_t> param_sizes_;
  int64_t n_buffers_ = -1;
  bool tensors_checked_ = false;           // check_tensors_once ran
  // start_from's tensors and their values, until the first averaging that packs x_ turns them
  // into anchors (take_start_values).
  std::vector<std::pair<Tensor, std::vector<float>>> start_values_;
  std::vector<std::string> level_labels_;  // "averager 2:4" per level, for failure reports
  // average_replicas' averaging over pg_ with the top level's compression: its own node and
  // leader groups, so that it never waits behind a fragment's averaging in flight. Made at its
  // first use.
  std::unique_ptr<detail::CompressedAverage> replicas_;
};

// Averages every `period` steps once warmup_steps have passed: at calls where
// step >= warmup_steps and (step - warmup_steps) % period == 0.
//
// Errors (hsgd::InvalidArgument, on every rank): null pg, period < 1, warmup_steps < 0, ranks
// passing different period or warm-up. period == 1 only warns (DDP alone would be cheaper).
// With LevelOptions also: group_size other than 0 or pg->size(), bad options
// (validate_options), ranks passing different options.
//
// Usage:
//   PeriodicModelAverager averager(LevelOptions{.period = 8, .outer = OuterOptimizer{.lr = 0.7,
//                                  .momentum = 0.9, .nesterov = true}, .overlap_steps = 1},
//                                  /*warmup_steps=*/100, pg);
class PeriodicModelAverager : public ModelAverager {
 public:
  // Plain averaging, as torch's.
  PeriodicModelAverager(int64_t period, int64_t warmup_steps,
                        std::shared_ptr<comm::ProcessGroup> pg, ModelAveragerOptions options = {});
  PeriodicModelAverager(LevelOptions level, int64_t warmup_steps,
                        std::shared_ptr<comm::ProcessGroup> pg, ModelAveragerOptions options = {});

  using ModelAverager::average_parameters;
  void average_parameters(const std::vector<Tensor>& params) override;

  int64_t period() const { return period_; }
  int64_t warmup_steps() const { return warmup_steps_; }

 protected:
  bool fragment_starts(size_t level, int64_t offset, int64_t step) const override;

 private:
  const int64_t period_;
  const int64_t warmup_steps_;
};

}  // namespace hsgd::distributed
