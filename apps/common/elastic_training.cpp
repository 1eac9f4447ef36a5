#include "apps/common/elastic_training.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <span>
#include <variant>

#include "apps/common/level_options.h"
#include "apps/common/metrics_log.h"
#include "apps/common/training_loop.h"
#include "comm/elastic/elastic_world.h"
#include "comm/launcher/exit_codes.h"
#include "comm/launcher/worker_liveness.h"
#include "comm/log.h"
#include "comm/process_group/work.h"
#include "framework/checkpoint/checkpoint_file.h"
#include "framework/nn/functional.h"
#include "framework/tensor/grad_mode.h"
#include "optim/lr_scheduler.h"

namespace hsgd::apps {
namespace {

using Clock = std::chrono::steady_clock;

// This rank's training state at its last consistent point: the model and optimizer (live
// objects) plus what the loop counts.
struct Replica {
  bool has_state = false;  // false on a joining node until a peer sent it
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t total_steps = 0;
  StateDict loader;  // the data position at `step`; empty: the start of `epoch`
  // This epoch's training sums on this rank (for the epoch's row).
  double loss_sum = 0, correct = 0;
  int64_t images = 0;
};

// This node's training configuration differs from the job's (a late joiner started with another
// model, mode or hierarchy): it leaves the job for good (kExitWillRepeat, so that its hsgd-run
// does not restart it into the same refusal).
class ConfigurationMismatch : public Error {
 public:
  using Error::Error;
};

// No member of a generation holds a training state: every node that had one is gone. An elastic
// run keeps no checkpoint to start from, so the job ends (kExitWillRepeat: a restart would find
// the same).
class TrainingStateLost : public Error {
 public:
  using Error::Error;
};

// What every member must agree on: the model's tensors (names and shapes), the parallel mode and
// its levels, the optimizer and the batch.
std::string configuration(const TrainingFlags& flags, const ParallelFlags& parallel,
                          nn::Module& model) {
  uint64_t h = 1469598103934665603ull;
  int64_t values = 0;
  for (const auto& [name, t] : model.state_dict()) {
    std::string shape = name + "[";
    for (int64_t d = 0; d < t.dim(); ++d) shape += std::to_string(t.size(d)) + ",";
    for (const char c : shape + "]") h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    values += t.numel();
  }
  char model_hash[17];
  std::snprintf(model_hash, sizeof model_hash, "%016llx", static_cast<unsigned long long>(h));
  return str_cat(
      "model ", model.state_dict().size(), " tensors, ", values, " values (shapes ", model_hash,
      "); mode ", parallel.mode, ", hierarchy '", parallel.hierarchy, "', period ", parallel.period,
      ", warm-up ", parallel.warmup_steps, ", subgroup size ", parallel.subgroup_size,
      ", top level outer ", parallel.levels.outer_lr, "/", parallel.levels.outer_momentum,
      parallel.levels.outer_nesterov ? "/nesterov" : "", " compression ",
      parallel.levels.compression, "/", parallel.levels.compression_scale,
      parallel.levels.error_feedback ? "/ef" : "", " overlap ", parallel.levels.overlap_steps, "; ",
      describe_optimizer(flags), ", batch ", flags.batch_size, ", schedule ", flags.schedule);
}

// Set (by rank 0) once a generation agreed on a state: from then on a joiner has none.
const std::string kTrainingStartedKey = comm::elastic::kElasticPrefix + "training-started";

// Why the loop leaves a generation.
enum class Leave { kFinished, kFailed, kJoin };

void refuse_unsupported(const TrainingFlags& flags, const ElasticRun& run) {
  HSGD_CHECK_AS(BadFlag, run.checkpoint_dir.empty(), "--checkpoint-dir ", run.checkpoint_dir,
                " is not supported in an elastic run (hsgd-run --nnodes MIN:MAX): a joining "
                "node receives the state from a live peer, not from disk");
  HSGD_CHECK_AS(BadFlag, flags.eval_every == 0, "--eval-every ", flags.eval_every,
                " is not supported in an elastic run (hsgd-run --nnodes MIN:MAX); evaluation "
                "happens at the end of each epoch");
}

// The top level's settled state (outer anchor and momentum, this rank's residual) with what it
// belongs to: the level's description, so that a generation whose top level differs (levels
// dropped on fewer ranks) starts it afresh.
struct TopLevelCarry {
  std::string level;  // carry_key() of the averager's last level; empty: nothing
  StateDict state;    // "levels.<i>.anchor", "outer_momentum", "residual" (settled_level_state)
};

// The level's description with a group of the whole world spelled "world": a level over the
// whole world is the same level on any number of ranks (its anchor is the world's last common
// point), while a level over part of the world keeps its size (8:4 on 8 ranks is not the 8:4
// that spanned a world of 4).
std::string carry_key(distributed::LevelOptions level, int world_size) {
  if (level.group_size == world_size) level.group_size = distributed::kWholeGroup;
  return distributed::describe(level);
}

// FNV-1a over the bytes of the model's parameters. Buffers (BatchNorm statistics) may differ
// between replicas as optimizer state does: each rank updates them from its own batches.
uint64_t model_hash(nn::Module& model) {
  uint64_t h = 1469598103934665603ull;
  for (const Tensor& t : model.parameters()) {
    const Tensor c = t.contiguous();
    const auto* bytes = reinterpret_cast<const unsigned char*>(c.data());
    for (size_t i = 0; i < static_cast<size_t>(c.numel()) * sizeof(float); ++i) {
      h = (h ^ bytes[i]) * 1099511628211ull;
    }
  }
  return h;
}

StateDict full_state(const ElasticRun& run, const optim::LRScheduler* scheduler, const Replica& r) {
  StateDict s;
  for (auto& [name, t] : run.model->state_dict()) s.set("model." + name, t.clone());
  s.merge("optimizer.", run.optimizer->state_dict());
  if (scheduler != nullptr) s.merge("scheduler.", scheduler->state_dict());
  s.merge("loader.", r.loader);
  s.set("step", r.step);
  s.set("epoch", r.epoch);
  s.set("total_steps", r.total_steps);
  return s;
}

void load_full_state(const StateDict& s, const ElasticRun& run, optim::LRScheduler* scheduler,
                     Replica& r) {
  nn::NamedTensors model;
  const StateDict m = s.with_prefix("model.");
  for (const auto& [name, value] : m.entries()) model.emplace_back(name, m.get_tensor(name));
  {
    NoGradGuard no_grad;
    run.model->load_state_dict(model);
  }
  run.optimizer->load_state_dict(s.with_prefix("optimizer."));
  if (scheduler != nullptr) scheduler->load_state_dict(s.with_prefix("scheduler."));
  r.loader = s.with_prefix("loader.");
  r.step = s.get_int("step");
  r.epoch = s.get_int("epoch");
  r.total_steps = s.get_int("total_steps");
  r.has_state = true;
  r.loss_sum = r.correct = 0;
  r.images = 0;
}

// Sends root's bytes to every rank of world (in int64 words, after their length).
void broadcast_bytes(comm::ProcessGroup& world, std::string& bytes, int root) {
  int64_t length = static_cast<int64_t>(bytes.size());
  world.broadcast(std::span<int64_t>(&length, 1), root, "elastic state length")->wait();
  std::vector<int64_t> words(static_cast<size_t>((length + 7) / 8));
  if (world.rank() == root) std::memcpy(words.data(), bytes.data(), bytes.size());
  world.broadcast(std::span<int64_t>(words), root, "elastic state")->wait();
  bytes.assign(reinterpret_cast<const char*>(words.data()), static_cast<size_t>(length));
}

// Averages tensors over the ranks with in_f (the others contribute zeros and receive the mean).
void average_over(comm::ProcessGroup& world, std::vector<Tensor> tensors, bool in_f, int count) {
  size_t total = 0;
  for (const Tensor& t : tensors) total += static_cast<size_t>(t.numel());
  std::vector<float> flat(total, 0.0f);
  if (in_f) {
    size_t at = 0;
    for (const Tensor& t : tensors) {
      const std::vector<float> v = t.to_vector();
      std::copy(v.begin(), v.end(), flat.begin() + static_cast<std::ptrdiff_t>(at));
      at += v.size();
    }
  }
  world.allreduce(std::span<float>(flat), comm::ReduceOp::kSum, "elastic survivors' average")
      ->wait();
  size_t at = 0;
  for (Tensor& t : tensors) {
    HSGD_CHECK(t.is_contiguous(), "elastic average: a model tensor is not contiguous");
    float* out = t.data();
    for (int64_t i = 0; i < t.numel(); ++i) out[i] = flat[at++] / static_cast<float>(count);
  }
}

class ElasticTrainer {
 public:
  ElasticTrainer(const TrainingFlags& flags, const ParallelFlags& parallel, ElasticRun run)
      : flags_(flags),
        parallel_flags_(parallel),
        run_(std::move(run)),
        elastic_(comm::elastic::ElasticWorldOptions::from_env()) {}

  int run() {
    const auto start = Clock::now();
    bool header = false;
    bool failed = false;
    for (;;) {
      world_ = elastic_.advance();
      lead_ = world_->rank() == 0;
      Leave leave = Leave::kFailed;
      try {
        enter_generation(failed);
        if (lead_ && !header) {
          std::printf("%5s %7s %10s %9s %10s %9s\n", "epoch", "steps", "train_loss", "train_acc",
                      "test_loss", "test_acc");
          header = true;
        }
        leave = train_generation();
      } catch (const CommError& e) {
        comm::logger()->warn("elastic generation {} (rank {} of {}) lost a member: {}",
                             elastic_.generation().number, world_->rank(), world_->size(),
                             e.what());
        leave = Leave::kFailed;
        // A step that failed is recomputed in the next generation (its batch is taken again).
        if (in_step_) ++discarded_steps_;
        in_step_ = false;
      }
      if (leave == Leave::kFinished) break;
      failed = leave == Leave::kFailed;
      // After a failure nobody waits for the others to leave: the world may lack a member.
      if (failed) world_->abort();
      leave_generation();
    }
    if (lead_) {
      std::printf("final test accuracy: %.2f%%\n", 100 * final_.accuracy);
      std::printf(
          "%s: elastic, %d generations, %d ranks at the end, mode %s, training wall "
          "time %.2f s (rank 0)\n",
          run_.program.c_str(), static_cast<int>(elastic_.generation().number + 1), world_->size(),
          parallel_flags_.mode.c_str(),
          std::chrono::duration<double>(Clock::now() - start).count());
      std::printf("%s: replica hash %016llx at step %lld\n", run_.program.c_str(),
                  static_cast<unsigned long long>(model_hash(*run_.model)),
                  static_cast<long long>(replica_.step));
      std::fflush(stdout);
    }
    leave_generation();
    elastic_.abandon();
    return 0;
  }

 private:
  // Collective over the new world: the state agreement of the file comment, then DDP, the hook,
  // the averager, the optimizer wrapper's parts and the data loader for this generation.
  void enter_generation(bool after_failure) {
    comm::ProcessGroup& world = *world_;
    const int64_t g = elastic_.generation().number;
    // Until some generation agreed on a state, the job has not trained: every member's initial
    // model (built from the same seed) is the state, whichever generation it first enters.
    if (!replica_.has_state && !elastic_.store().check({kTrainingStartedKey})) {
      replica_.has_state = true;
    }
    // Each rank's step (-1: no state), whether it left its last generation on a failure, and
    // how many steps it began and discarded since it last said so.
    const int64_t mine = replica_.has_state ? replica_.step : -1;
    const int64_t said[3] = {mine, after_failure ? 1 : 0, discarded_steps_};
    discarded_steps_ = 0;
    std::vector<int64_t> gathered(3 * static_cast<size_t>(world.size()));
    world
        .allgather(std::span<const int64_t>(said, 3), std::span<int64_t>(gathered), "elastic steps")
        ->wait();
    std::vector<int64_t> steps;
    bool any_failure = false;
    int64_t discarded = 0;
    for (int r = 0; r < world.size(); ++r) {
      steps.push_back(gathered[3 * static_cast<size_t>(r)]);
      any_failure = any_failure || gathered[3 * static_cast<size_t>(r) + 1] != 0;
      discarded += gathered[3 * static_cast<size_t>(r) + 2];
    }
    const int64_t top = *std::max_element(steps.begin(), steps.end());
    if (top < 0) {
      throw TrainingStateLost(
          str_cat("elastic generation ", g, " (", elastic_.generation().describe(),
                  "): no member holds the training state; every node that trained is gone, and an "
                  "elastic run keeps no checkpoint to start again from"));
    }
    int source = -1, at_top = 0;
    for (int r = 0; r < world.size(); ++r) {
      if (steps[static_cast<size_t>(r)] != top) continue;
      if (source < 0) source = r;
      ++at_top;
    }
    std::vector<std::string> configs;
    const std::string config = configuration(flags_, parallel_flags_, *run_.model);
    world.allgather_bytes(config, configs, "elastic configuration")->wait();
    std::vector<int> differing;
    for (int r = 0; r < world.size(); ++r) {
      if (configs[static_cast<size_t>(r)] != configs[static_cast<size_t>(source)]) {
        differing.push_back(r);
      }
    }
    if (!differing.empty()) {
      if (config != configs[static_cast<size_t>(source)]) {
        throw ConfigurationMismatch(
            str_cat("this node cannot join elastic generation ", g, ": its configuration\n  ",
                    config, "\ndiffers from the job's (rank ", source, ")\n  ",
                    configs[static_cast<size_t>(source)],
                    "\nstart it with the same program and flags as the other nodes"));
      }
      std::string ranks;
      for (int r : differing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      HSGD_THROW(CommError, "elastic generation ", g, ": rank(s) ", ranks,
                 " joined with another configuration (", configs[static_cast<size_t>(differing[0])],
                 "); they leave the job");
    }
    const bool in_f = mine == top;
    const auto agreement_start = Clock::now();
    size_t state_bytes = 0;
    if (any_failure && parallel_flags_.mode != "ddp" && at_top > 1) {
      std::vector<Tensor> tensors = run_.model->parameters();
      tensors.insert(tensors.end(), run_.average_buffers.begin(), run_.average_buffers.end());
      average_over(world, std::move(tensors), in_f, at_top);
    }
    if (at_top < world.size()) {
      std::string bytes;
      if (world.rank() == source) {
        bytes = checkpoint::encode_state(source, replica_.step,
                                         full_state(run_, scheduler_.get(), replica_))
                    .SerializeAsString();
      }
      broadcast_bytes(world, bytes, source);
      state_bytes = bytes.size();
      if (!in_f) {
        checkpoint::proto::RankState proto;
        HSGD_CHECK_AS(CommError, proto.ParseFromString(bytes), "elastic generation ", g,
                      ": the state from rank ", source, " does not parse (", bytes.size(),
                      " bytes)");
        const StateDict state =
            checkpoint::decode_state(proto, "the state of rank " + std::to_string(source));
        if (scheduler_ == nullptr && state.get_int("total_steps") > 0) {
          replica_.total_steps = state.get_int("total_steps");
          make_scheduler_for(world);
        }
        load_full_state(state, run_, scheduler_.get(), replica_);
      }
    }
    const uint64_t hash = model_hash(*run_.model);
    const int64_t mine_hash = static_cast<int64_t>(hash);
    std::vector<int64_t> hashes(static_cast<size_t>(world.size()));
    world
        .allgather(std::span<const int64_t>(&mine_hash, 1), std::span<int64_t>(hashes),
                   "elastic replica hashes")
        ->wait();
    for (int r = 0; r < world.size(); ++r) {
      HSGD_CHECK(hashes[static_cast<size_t>(r)] == mine_hash, "elastic generation ", g,
                 ": the replicas differ after the state agreement (rank ", world.rank(), " hash ",
                 hash, ", rank ", r, " hash ",
                 static_cast<uint64_t>(hashes[static_cast<size_t>(r)]), ")");
    }

    // Work thrown away by this change: the steps the survivors discarded, and the local steps
    // of the lost workers since the last step at which every replica was the same (estimated
    // with the survivors' newest step: a lost worker was at most one step apart).
    const int lost_workers = lost_worker_count();
    const int64_t thrown_away =
        discarded + lost_workers * std::max<int64_t>(0, top - boundary_step_);
    boundary_step_ = overlapped_start_step_ = replica_.step;
    if (world.rank() == 0) {
      elastic_.store().set(kTrainingStartedKey, comm::to_bytes("1"));
      if (thrown_away > 0) elastic_.store().add(comm::elastic::kStepsThrownAwayKey, thrown_away);
    }
    parallel_ = make_parallel(run_.model, world_, parallel_flags_, run_.average_buffers);
    if (parallel_.hook_state) parallel_.hook_state->iter = replica_.step;
    if (parallel_.averager) parallel_.averager->set_step(replica_.step);
    if (parallel_.averager) carry_top_level(world, source);
    data::DataLoaderOptions options = run_.loader;
    options.rank = world.rank();
    options.world_size = world.size();
    loader_ = std::make_unique<data::DataLoader>(run_.train, options);
    if (replica_.loader.size() > 0) {
      loader_->load_state_dict(replica_.loader);
    } else {
      loader_->set_epoch(replica_.epoch);
    }
    if (replica_.total_steps == 0) {
      replica_.total_steps = planned_steps(flags_, *loader_);
      make_scheduler_for(world);
    }
    if (lead_) {
      const double ms =
          std::chrono::duration<double, std::milli>(Clock::now() - agreement_start).count();
      std::string levels;
      if (parallel_.averager) {
        for (const auto& level : parallel_.averager->level_stats()) {
          levels += (levels.empty() ? "" : ", ") + std::to_string(level.period) + ":" +
                    std::to_string(level.group_size);
        }
        levels = ", levels {" + levels + "}";
      }
      std::string changes = generation_change();
      if (!changes.empty()) changes = " " + changes + ";";
      std::string transfer = "every rank had the state";
      if (at_top < world.size()) {
        transfer = str_cat(world.size() - at_top, " rank(s) received the state from rank ", source,
                           " (", state_bytes, " bytes)");
      }
      std::printf(
          "%s: generation %lld:%s %zu nodes, %d workers%s, at step %lld%s; %s%s; agreement "
          "%.0f ms; replica hash %016llx equal on all %d ranks\n",
          run_.program.c_str(), static_cast<long long>(g), changes.c_str(),
          elastic_.generation().nodes.size(), world.size(), levels.c_str(),
          static_cast<long long>(replica_.step),
          any_failure
              ? str_cat(" after a failure (", thrown_away, " worker-steps thrown away)").c_str()
              : "",
          transfer.c_str(), carried_.c_str(), ms, static_cast<unsigned long long>(hash),
          world.size());
      std::fflush(stdout);
    }
    write_metrics({.generation = MetricsRecord::Generation{
                       .number = g,
                       .nodes = static_cast<int>(elastic_.generation().nodes.size()),
                       .workers = world.size(),
                       .change = generation_change(),
                       .failure = any_failure,
                       .state_bytes = static_cast<int64_t>(state_bytes),
                       .agreement_ms =
                           std::chrono::duration<double, std::milli>(Clock::now() - agreement_start)
                               .count()}});
    previous_ = elastic_.generation();
  }

  // Collective over the new world: a top level that keeps state (outer optimizer, compression)
  // continues from the source's anchor and outer momentum, on every rank (a failure during an
  // averaging may have left the survivors' anchors apart), when the source's previous top level
  // was the same level; else it starts afresh (its first averaging is plain). With it, each rank
  // keeps its own error-feedback residual when its previous top level was the same level and
  // left one settled (no averaging pending there, see settled_level_state): the residual is the
  // part of this rank's past contributions that rounding kept back, and adding it to the next
  // averaging delivers it whatever the group (it is in units of the group's sum, so it enters
  // the next mean divided by the new group size). A joiner has contributed nothing and starts at
  // zero; so does a rank whose ring was interrupted. Lower levels always start afresh: their
  // groups change with the membership.
  void carry_top_level(comm::ProcessGroup& world, int source) {
    distributed::ModelAverager& averager = *parallel_.averager;
    const size_t top = averager.level_options().size() - 1;
    const distributed::LevelOptions& options = averager.level_options()[top];
    carried_.clear();
    if (!distributed::is_anchored(options)) return;
    // This rank's previous top level is the same level (its carried state applies).
    const bool same_level = top_carry_.level == carry_key(options, world.size());
    std::string bytes;
    if (world.rank() == source) {
      StateDict carry;
      if (same_level) {
        for (const auto& [key, value] : top_carry_.state.entries()) {
          const std::string name = key.substr(key.rfind('.') + 1);
          if (name == "anchor" || name == "outer_momentum") carry.set(name, value);
        }
      }
      bytes = checkpoint::encode_state(source, replica_.step, carry).SerializeAsString();
    }
    broadcast_bytes(world, bytes, source);
    checkpoint::proto::RankState proto;
    HSGD_CHECK_AS(CommError, proto.ParseFromString(bytes),
                  "elastic: the top level's state from rank ", source, " does not parse (",
                  bytes.size(), " bytes)");
    const StateDict carry =
        checkpoint::decode_state(proto, "the top level's state of rank " + std::to_string(source));
    if (!carry.contains("anchor")) return;
    StateDict state;
    state.set("step", replica_.step);
    const std::string level = "levels." + std::to_string(top) + ".";
    for (const auto& [key, value] : carry.entries()) state.set(level + key, value);
    // {kept a residual, kept a non-zero one} on this rank.
    std::array<int64_t, 2> mine{0, 0};
    if (same_level) {
      for (const auto& [key, value] : top_carry_.state.entries()) {
        if (!key.ends_with(".residual")) continue;
        state.set(level + "residual", value);
        mine[0] = 1;
        for (const float e : std::get<Tensor>(value).to_vector()) {
          mine[1] |= static_cast<int64_t>(e != 0.0f);
        }
      }
    }
    averager.load_state_dict(state);
    std::vector<int64_t> all(2 * static_cast<size_t>(world.size()));
    world.allgather(std::span<const int64_t>(mine), std::span<int64_t>(all), "elastic residuals")
        ->wait();
    int64_t kept = 0;
    int64_t nonzero = 0;
    for (size_t r = 0; r < all.size(); r += 2) {
      kept += all[r];
      nonzero += all[r + 1];
    }
    carried_ =
        str_cat("; top level ", distributed::describe(options),
                carry.contains("outer_momentum") ? ": anchor and outer momentum" : ": anchor",
                " from rank ", source);
    if (options.error_feedback) {
      carried_ += str_cat(", error-feedback residuals kept on ", kept, " of ", world.size(),
                          " ranks (non-zero on ", nonzero, ")");
    }
  }

  // The workers of the previous generation entered that are not in the current one.
  int lost_worker_count() const {
    int lost = 0;
    for (const auto& node : previous_.nodes) {
      if (elastic_.generation().node_rank(node.id) < 0) lost += node.local_world_size;
    }
    return lost;
  }

  // "lost node H (ID); joined node H (ID)" against the previous generation entered; "" if none.
  std::string generation_change() const {
    std::vector<std::string> changes;
    const comm::elastic::Generation& now = elastic_.generation();
    for (const auto& node : previous_.nodes) {
      if (now.node_rank(node.id) < 0)
        changes.push_back("lost node " + node.host + " (" + node.id + ")");
    }
    for (const auto& node : now.nodes) {
      if (previous_.number >= 0 && previous_.node_rank(node.id) < 0) {
        changes.push_back("joined node " + node.host + " (" + node.id + ")");
      }
    }
    std::string out;
    for (const std::string& c : changes) out += (out.empty() ? "" : "; ") + c;
    return out;
  }

  void make_scheduler_for(comm::ProcessGroup&) {
    scheduler_ = make_scheduler(flags_, *run_.optimizer, replica_.total_steps);
  }

  // Releases every object that holds a group of the generation, then the world itself.
  void leave_generation() {
    // A generation whose top level keeps no state (on fewer ranks the world level may be
    // dropped) leaves the last one that did: the anchor is the world's last common point, and
    // the progress since is the next pseudo-gradient.
    if (parallel_.averager &&
        distributed::is_anchored(parallel_.averager->level_options().back())) {
      const auto& levels = parallel_.averager->level_options();
      top_carry_ = TopLevelCarry{
          .level = carry_key(levels.back(), parallel_.averager->process_group()->size()),
          .state = parallel_.averager->settled_level_state(levels.size() - 1)};
    }
    batch_.reset();
    loader_.reset();
    parallel_ = Parallel{};
    elastic_.abandon();
    world_.reset();
  }

  bool at_world_boundary() const {
    if (parallel_flags_.mode == "ddp") return true;
    if (replica_.step <= parallel_flags_.warmup_steps) return true;
    return parallel_.averager && parallel_.averager->averaged_whole_group_last_step();
  }

  // An averaging of the whole world started in the last step and is in flight (overlap): the
  // replicas are equal once it completes, which a join makes happen at once.
  bool overlapped_world_start() const {
    return parallel_.averager && parallel_.averager->started_whole_group_averaging_last_step() &&
           parallel_.averager->has_pending();
  }

  // Trains until the run ends (kFinished), a collective fails (throws) or the ranks agree to move
  // to a newer generation (kJoin).
  Leave train_generation() {
    comm::ProcessGroup& world = *world_;
    while (replica_.epoch < flags_.epochs && replica_.step < replica_.total_steps) {
      if (!batch_) batch_.emplace(loader_->begin());
      if (*batch_ == loader_->end()) {
        end_epoch();
        continue;
      }
      in_step_ = true;
      step(**batch_);
      ++*batch_;
      const bool overlapped = overlapped_world_start();
      if (overlapped || at_world_boundary()) {
        // With overlap, the snapshot of the previous world averaging is merged into every
        // replica by now (a level merges before it starts again).
        boundary_step_ = overlapped ? overlapped_start_step_ : replica_.step;
        if (overlapped) overlapped_start_step_ = replica_.step;
        double newer = elastic_.newer_generation_announced() ? 1.0 : 0.0;
        world.allreduce(std::span<double>(&newer, 1), comm::ReduceOp::kMax, "elastic join vote")
            ->wait();
        if (newer > 0) {
          // No local step since the snapshot: completing the averaging now leaves every replica
          // at the group's result, the same as an averaging without overlap.
          if (overlapped) parallel_.averager->finish_pending(run_.model->parameters());
          boundary_step_ = replica_.step;
          return Leave::kJoin;
        }
      }
    }
    finish();
    return Leave::kFinished;
  }

  void step(const data::Batch& batch) {
    run_.optimizer->zero_grad();
    const Tensor logits = parallel_.forward(*run_.model, batch.inputs);
    Tensor loss = nn::cross_entropy(logits, batch.targets);
    loss.backward();  // a failed gradient allreduce throws here: nothing applied yet
    run_.optimizer->step();
    if (scheduler_ != nullptr) scheduler_->step();
    const double loss_value = loss.item();
    HSGD_CHECK(std::isfinite(loss_value) || flags_.allow_nonfinite_loss, "the training loss is ",
               loss_value, " at step ", replica_.step + 1, ": training diverged; lower --lr");
    const auto n = static_cast<double>(batch.targets.size());
    replica_.loss_sum += loss_value * n;
    replica_.correct += nn::accuracy(logits, batch.targets) * n;
    replica_.images += static_cast<int64_t>(batch.targets.size());
    ++replica_.step;
    // The step is done: its data position goes with its count (a discarded step retakes its
    // batch). Saved before the averaging below, so that a failed averaging, which does not undo
    // the step, leaves the two consistent on every rank.
    replica_.loader = loader_->state_dict();
    in_step_ = false;
    comm::report_progress(replica_.step);
    if (lead_ && flags_.log_every > 0 && replica_.step % flags_.log_every == 0) {
      write_metrics({.train_loss = loss_value,
                     .lr = run_.optimizer->param_groups().front().lr.value_or(flags_.lr)});
      std::printf("[%s] step %lld loss %.4f (generation %lld, %d ranks)\n", run_.program.c_str(),
                  static_cast<long long>(replica_.step), loss_value,
                  static_cast<long long>(elastic_.generation().number), world_->size());
      std::fflush(stdout);
    }
    // The averaging comes after the step is counted: when it fails, the next generation's
    // survivors' average replaces it.
    if (parallel_.averager) parallel_.averager->average_parameters(run_.model->parameters());
  }

  void end_epoch() {
    comm::ProcessGroup& world = *world_;
    std::vector<double> sums{replica_.loss_sum, replica_.correct,
                             static_cast<double>(replica_.images)};
    world.allreduce(std::span<double>(sums), comm::ReduceOp::kSum, "elastic epoch sums")->wait();
    const bool last = replica_.epoch + 1 >= flags_.epochs || replica_.step >= replica_.total_steps;
    EvalResult eval = evaluate_average(last);
    write_metrics({.test_loss = eval.loss, .test_accuracy = eval.accuracy});
    if (lead_) {
      const double denom = sums[2] > 0 ? sums[2] : 1.0;
      std::printf("%5lld %7lld %10.4f %8.2f%% %10.4f %8.2f%%  (%d ranks)\n",
                  static_cast<long long>(replica_.epoch + 1), static_cast<long long>(replica_.step),
                  sums[0] / denom, 100 * sums[1] / denom, eval.loss, 100 * eval.accuracy,
                  world.size());
      std::fflush(stdout);
    }
    ++replica_.epoch;
    replica_.loss_sum = replica_.correct = 0;
    replica_.images = 0;
    replica_.loader = StateDict{};
    batch_.reset();
    if (replica_.epoch < flags_.epochs) loader_->set_epoch(replica_.epoch);
  }

  EvalResult evaluate_average(bool keep) {
    // An overlapped averaging still in flight is merged first when keeping (as the fixed-size
    // loop does).
    if (keep && parallel_.averager) parallel_.averager->finish_pending(run_.model->parameters());
    distributed::AveragedReplicas average(world_, run_.model);
    if (keep) average.keep();
    // Every rank evaluates a shard of the test set: no rank waits in a collective while another
    // evaluates (the collective timeout of an elastic run is short).
    int64_t examples = 0;
    const EvalResult shard = evaluate_shard(*run_.model, *run_.test, flags_.max_eval,
                                            world_->rank(), world_->size(), examples);
    std::vector<double> sums{shard.loss, shard.accuracy, static_cast<double>(examples)};
    world_->allreduce(std::span<double>(sums), comm::ReduceOp::kSum, "elastic evaluation")->wait();
    EvalResult eval;
    if (sums[2] > 0) eval = EvalResult{.loss = sums[0] / sums[2], .accuracy = sums[1] / sums[2]};
    final_ = eval;
    return eval;
  }

  // The members leave the world together afterwards (ElasticWorld::abandon).
  void finish() {
    if (replica_.epoch < flags_.epochs) {  // stopped by --max-steps inside an epoch
      end_epoch();
    }
  }

  const TrainingFlags flags_;
  const ParallelFlags parallel_flags_;
  const ElasticRun run_;
  comm::elastic::ElasticWorld elastic_;
  std::shared_ptr<comm::ProcessGroup> world_;
  bool lead_ = false;
  Replica replica_;
  Parallel parallel_;
  std::unique_ptr<data::DataLoader> loader_;
  std::optional<data::DataLoader::Iterator> batch_;  // the next batch of the epoch
  std::unique_ptr<optim::LRScheduler> scheduler_;
  EvalResult final_;
  comm::elastic::Generation previous_{.number = -1};  // the last generation entered
  bool in_step_ = false;                              // inside step(): a failure discards it
  int64_t discarded_steps_ = 0;        // steps discarded since the last state agreement
  int64_t boundary_step_ = 0;          // the last step after which every replica was the same
  int64_t overlapped_start_step_ = 0;  // the last step that started an overlapped world averaging
  TopLevelCarry top_carry_;  // the top level's state when this rank left its last generation
  std::string carried_;      // what carry_top_level took, for the generation line
  const Clock::time_point start_ = Clock::now();
  std::unique_ptr<MetricsLog> metrics_;  // rank 0's --metrics-out

  double wall_seconds() const {
    return std::chrono::duration<double>(Clock::now() - start_).count();
  }
  void write_metrics(MetricsRecord record) {
    if (!lead_ || flags_.metrics_out.empty()) return;
    if (metrics_ == nullptr) metrics_ = std::make_unique<MetricsLog>(flags_.metrics_out, 0);
    record.step = replica_.step;
    record.epoch = replica_.epoch + 1;
    record.wall_s = record.train_s = wall_seconds();
    if (parallel_.averager) record.averaging = parallel_.averager->level_stats();
    metrics_->write(record);
  }
};

}  // namespace

int train_elastic(const TrainingFlags& flags, const ParallelFlags& parallel, ElasticRun run) {
  refuse_unsupported(flags, run);
  const std::string program = run.program;
  ElasticTrainer trainer(flags, parallel, std::move(run));
  try {
    return trainer.run();
  } catch (const TrainingStateLost& e) {
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), e.what());
    return comm::launcher::kExitWillRepeat;
  } catch (const ConfigurationMismatch& e) {
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), e.what());
    return comm::launcher::kExitWillRepeat;
  }
}

}  // namespace hsgd::apps
