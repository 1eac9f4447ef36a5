#include "framework/distributed/model_averaging/averaging_level.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "comm/error.h"
#include "comm/log.h"

namespace hsgd::distributed::detail {
namespace {

Tensor to_tensor(std::span<const float> values) {
  return from_vector(std::vector<float>(values.begin(), values.end()),
                     {static_cast<int64_t>(values.size())});
}

std::vector<float> tensor_values(const StateDict& state, const std::string& key) {
  return state.get_tensor(key).to_vector();
}

double seconds_of(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

}  // namespace

AveragingLevel::AveragingLevel(size_t index, LevelOptions options,
                               std::shared_ptr<comm::ProcessGroup> group, int64_t fragment)
    : index_(index),
      options_(std::move(options)),
      group_(std::move(group)),
      delay_(merge_delay(options_)),
      name_(fragment < 0 ? str_cat("model averaging level ", index)
                         : str_cat("model averaging level ", index, " fragment ", fragment)) {
  if (group_ != nullptr && options_.compression != Compression::kNone && group_->size() >= 2) {
    compressed_ = std::make_unique<CompressedAverage>(group_, options_.compression,
                                                      options_.compression_scale);
  }
  // Compression rounds only what crosses a node: a group on one node (a group of one rank
  // included) averages in float32, so the option does nothing there. Said once per group.
  if (group_ != nullptr && options_.compression != Compression::kNone && group_->rank() == 0 &&
      fragment <= 0 && (compressed_ == nullptr || compressed_->nodes() == 1)) {
    comm::logger()->warn(
        "model averaging level {} ({}): the {} ranks of group '{}' are on one node, so "
        "compression {}{} does nothing there: values are rounded only between nodes, and this "
        "group averages in float32",
        index_, describe(options_), group_->size(), group_->name(), to_string(options_.compression),
        options_.error_feedback ? " with error feedback" : "");
  }
}

AveragingLevel::~AveragingLevel() {
  if (!pending_ || !pending_->work) return;
  try {
    pending_->work->wait(group_->timeout());
  } catch (const std::exception& e) {
    comm::logger()->warn("{}: the averaging in flight failed: {}", name_, e.what());
  }
}

void AveragingLevel::check_size(const char* what, size_t expected, size_t got) const {
  HSGD_CHECK(expected == got, name_, " (", describe(options_), "): ", what, " holds ", expected,
             " values but the averaged tensors have ", got,
             "; with an outer optimizer, overlap or compression the parameters with a gradient "
             "(and the buffers) must stay the same from one averaging to the next");
}

int64_t AveragingLevel::start(int64_t step, std::span<const float> x, int64_t n_params) {
  HSGD_CHECK(!pending_, name_, ": started at step ", step, " while the averaging of step ",
             pending_->start, " is pending");
  HSGD_CHECK(group_ != nullptr, name_, ": not a member of its group");
  const size_t n = x.size();
  const float g = static_cast<float>(group_->size());
  auto issued = std::chrono::steady_clock::now();
  Pending p{.start = step,
            .due = step + delay_,
            .n_params = n_params,
            .snapshot = {},
            .work = nullptr,
            .transfer = {}};
  p.first = anchored() && anchor_.empty();
  if (anchored() && !p.first) check_size("the anchor", anchor_.size(), n);
  mean_.resize(n);
  int64_t bytes = 0;
  if (!anchored() || p.first) {
    // Exactly the plain averager's arithmetic: x / g, summed.
    for (size_t i = 0; i < n; ++i) mean_[i] = x[i] / g;
    p.work = group_->allreduce(std::span<float>(mean_), comm::ReduceOp::kSum);
    bytes = static_cast<int64_t>(n * sizeof(float));
  } else if (compressed_ == nullptr) {
    // kNone, or a compressed level whose group is one rank (nothing crosses a node).
    for (size_t i = 0; i < n; ++i) mean_[i] = (anchor_[i] - x[i]) / g;
    p.work = group_->allreduce(std::span<float>(mean_), comm::ReduceOp::kSum);
    bytes = static_cast<int64_t>(n * sizeof(float));
  } else {
    const auto params = static_cast<size_t>(n_params);
    for (size_t i = 0; i < n; ++i) mean_[i] = anchor_[i] - x[i];
    if (params < n) {
      // The buffers (running statistics) are averaged exactly, in float32: their rounding is no
      // pseudo-gradient error that feedback repays later, and it can push a variance below zero.
      for (size_t i = params; i < n; ++i) mean_[i] /= g;
      p.work = group_->allreduce(std::span<float>(mean_).subspan(params), comm::ReduceOp::kSum);
      bytes += static_cast<int64_t>((n - params) * sizeof(float));
    }
    if (options_.error_feedback) {
      // A residual saved when the buffers were compressed too holds them last: dropped.
      if (residual_.size() == n && params < n) residual_.resize(params);
      if (residual_.empty()) residual_.assign(params, 0.0f);
      check_size("the error-feedback residual", residual_.size(), params);
    }
    p.compressed = true;
    bytes += compressed_->start(
        std::span<float>(mean_).first(params),
        options_.error_feedback ? std::span<float>(residual_) : std::span<float>());
    issued = std::chrono::steady_clock::now();  // the ring between nodes starts now
  }
  if (delay_ > 0) p.snapshot.assign(x.begin(), x.end());
  p.transfer = Transfer{.start = seconds_of(issued), .end = 0, .bytes = bytes};
  pending_ = std::move(p);
  return bytes;
}

double AveragingLevel::receive() {
  HSGD_CHECK(pending_.has_value(), name_, ": nothing to receive");
  Pending& p = *pending_;
  if (p.received) return 0.0;
  const auto start = std::chrono::steady_clock::now();
  if (p.work) {
    p.work->wait(group_->timeout());
    p.transfer.end = seconds_of(p.work->finished_at());
    p.work.reset();
  }
  if (p.compressed) {
    compressed_->wait();  // leaves D in mean_ (compressed_average.h)
    p.transfer.end = std::max(p.transfer.end,
                              compressed_->leader() && compressed_->nodes() >= 2
                                  ? seconds_of(compressed_->ring_finished_at())
                                  : seconds_of(std::chrono::steady_clock::now()));
  }
  p.received = true;
  received_ = p.transfer;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void AveragingLevel::outer_step(std::span<const float> gradient) {
  const OuterOptimizer outer = options_.outer.value_or(OuterOptimizer{});
  const auto lr = static_cast<float>(outer.lr);
  const auto m = static_cast<float>(outer.momentum);
  if (m != 0.0f && momentum_.empty()) {
    momentum_.assign(gradient.begin(), gradient.end());  // torch: buf = clone(d_p)
  } else if (m != 0.0f) {
    check_size("the outer momentum", momentum_.size(), gradient.size());
    for (size_t i = 0; i < gradient.size(); ++i) momentum_[i] = momentum_[i] * m + gradient[i];
  }
  for (size_t i = 0; i < gradient.size(); ++i) {
    float d = gradient[i];
    if (m != 0.0f) d = outer.nesterov ? d + m * momentum_[i] : momentum_[i];
    anchor_[i] = anchor_[i] + (-lr) * d;
  }
}

std::span<const float> AveragingLevel::complete(std::span<float> x) {
  HSGD_CHECK(pending_.has_value(), name_, ": nothing to complete");
  receive();
  const Pending& p = *pending_;
  check_size("the averaging in flight", mean_.size(), x.size());
  std::span<const float> result = mean_;
  if (anchored()) {
    if (p.first) {
      anchor_ = mean_;
    } else {
      const auto n_params = static_cast<size_t>(p.n_params);
      outer_step(std::span<const float>(mean_).first(n_params));
      for (size_t i = n_params; i < x.size(); ++i) anchor_[i] = anchor_[i] - mean_[i];
    }
    result = anchor_;
  }
  if (p.snapshot.empty()) {
    std::copy(result.begin(), result.end(), x.begin());
  } else {
    for (size_t i = 0; i < x.size(); ++i) x[i] = result[i] + (x[i] - p.snapshot[i]);
  }
  pending_.reset();
  return result;
}

void AveragingLevel::reset_anchor(std::span<const float> r) {
  HSGD_CHECK(!pending_, name_, ": anchor reset while pending");
  if (anchored()) anchor_.assign(r.begin(), r.end());
}

void AveragingLevel::reset_anchor_part(std::span<const float> r, size_t at) {
  HSGD_CHECK(!pending_, name_, ": anchor reset while pending");
  if (!anchored() || anchor_.empty()) return;
  check_size("the anchor", anchor_.size(), std::max(anchor_.size(), at + r.size()));
  std::copy(r.begin(), r.end(), anchor_.begin() + static_cast<std::ptrdiff_t>(at));
}

std::optional<AveragingLevel::Transfer> AveragingLevel::take_transfer() {
  return std::exchange(received_, std::nullopt);
}

void AveragingLevel::save(StateDict& state, const std::string& prefix) {
  if (pending_) receive();  // a compressed averaging in flight still updates the residual
  if (!anchor_.empty()) state.set(prefix + "anchor", to_tensor(anchor_));
  if (!momentum_.empty()) state.set(prefix + "outer_momentum", to_tensor(momentum_));
  if (!residual_.empty()) state.set(prefix + "residual", to_tensor(residual_));
  if (!pending_) return;
  const Pending& p = *pending_;
  state.set(prefix + "pending.start", p.start);
  state.set(prefix + "pending.due", p.due);
  state.set(prefix + "pending.n_params", p.n_params);
  state.set(prefix + "pending.first", int64_t{p.first});
  state.set(prefix + "pending.mean", to_tensor(mean_));
  if (!p.snapshot.empty()) state.set(prefix + "pending.snapshot", to_tensor(p.snapshot));
}

void AveragingLevel::save_settled(StateDict& state, const std::string& prefix) const {
  if (!anchor_.empty()) state.set(prefix + "anchor", to_tensor(anchor_));
  if (!momentum_.empty()) state.set(prefix + "outer_momentum", to_tensor(momentum_));
  if (!pending_ && !residual_.empty()) state.set(prefix + "residual", to_tensor(residual_));
}

void AveragingLevel::load(const StateDict& state, const std::string& prefix) {
  if (pending_ && pending_->work) {
    pending_->work->wait(group_->timeout());
  }
  if (compressed_) compressed_->wait();
  pending_.reset();
  received_.reset();
  const auto optional_values = [&](const std::string& key) {
    return state.contains(prefix + key) ? tensor_values(state, prefix + key) : std::vector<float>();
  };
  anchor_ = optional_values("anchor");
  momentum_ = optional_values("outer_momentum");
  residual_ = optional_values("residual");
  if (!state.contains(prefix + "pending.start")) return;
  Pending p{.start = state.get_int(prefix + "pending.start"),
            .due = state.get_int(prefix + "pending.due"),
            .n_params = state.get_int(prefix + "pending.n_params"),
            .first = state.get_int(prefix + "pending.first") != 0,
            .received = true,
            .snapshot = {},
            .work = nullptr,
            .transfer = {}};
  mean_ = tensor_values(state, prefix + "pending.mean");
  p.snapshot = optional_values("pending.snapshot");
  HSGD_CHECK(p.snapshot.empty() || p.snapshot.size() == mean_.size(), "load_state_dict: ", prefix,
             "pending.snapshot has ", p.snapshot.size(), " values, ", prefix, "pending.mean ",
             mean_.size());
  HSGD_CHECK(p.n_params >= 0 && static_cast<size_t>(p.n_params) <= mean_.size(),
             "load_state_dict: ", prefix, "pending.n_params ", p.n_params, " must be in [0, ",
             mean_.size(), "]");
  pending_ = std::move(p);
}

}  // namespace hsgd::distributed::detail
