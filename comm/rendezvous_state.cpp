#include "comm/rendezvous_state.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <utility>

namespace hsgd::comm {

// A get/wait/multi_get whose keys were not all present. Registered in the waiter list of each
// missing key; `remaining` counts the lists it is still in.
struct RendezvousState::Waiter {
  std::string job;
  uint64_t id = 0;
  proto::Op op = proto::OP_UNSPECIFIED;
  std::vector<std::string> keys;     // as requested: multi_get answers in this order
  std::vector<std::string> missing;  // distinct keys it was registered on
  size_t remaining = 0;
  bool done = false;          // answered, timed out or dropped
  uint64_t deletes_seen = 0;  // Job::deletes when it last checked its keys
  Reply reply;
  std::unique_ptr<asio::steady_timer> timer;
};

struct RendezvousState::Job {
  std::unordered_map<std::string, std::string> values;
  std::unordered_map<std::string, std::vector<std::shared_ptr<Waiter>>> waiters;
  uint64_t deletes = 0;  // keys deleted so far: a waiter re-checks its keys only if this moved
};

namespace {

proto::Response invalid(const proto::Request& request, std::string error) {
  proto::Response response;
  response.set_id(request.id());
  response.set_status(proto::STATUS_INVALID_ARGUMENT);
  response.set_error(std::move(error));
  return response;
}

bool is_blocking(proto::Op op) {
  return op == proto::OP_GET || op == proto::OP_WAIT || op == proto::OP_MULTI_GET;
}

// Expected number of keys and values of each op (-1: any number, values must match keys).
struct Arity {
  int keys;
  int values;
};

std::optional<Arity> arity(proto::Op op) {
  switch (op) {
    case proto::OP_SET:
      return Arity{1, 1};
    case proto::OP_GET:
      return Arity{1, 0};
    case proto::OP_ADD:
      return Arity{1, 0};
    case proto::OP_COMPARE_SET:
      return Arity{1, 2};
    case proto::OP_WAIT:
      return Arity{-1, 0};
    case proto::OP_CHECK:
      return Arity{-1, 0};
    case proto::OP_DELETE_KEY:
      return Arity{1, 0};
    case proto::OP_NUM_KEYS:
      return Arity{0, 0};
    case proto::OP_MULTI_GET:
      return Arity{-1, 0};
    case proto::OP_MULTI_SET:
      return Arity{-1, -1};
    case proto::OP_PING:
      return Arity{0, 0};
    default:
      return std::nullopt;
  }
}

}  // namespace

RendezvousState::RendezvousState(RendezvousLimits limits) : limits_(limits) {}

RendezvousState::~RendezvousState() { clear(); }

std::optional<proto::Response> RendezvousState::check_limits(const proto::Request& request) const {
  const auto expected = arity(request.op());
  if (!expected) return invalid(request, "unknown operation " + std::to_string(request.op()));
  const auto& name = proto::Op_Name(request.op());
  const int num_keys = request.keys_size();
  const int num_values = request.values_size();
  if (expected->keys >= 0 && num_keys != expected->keys) {
    return invalid(request, name + " takes " + std::to_string(expected->keys) + " key(s), got " +
                                std::to_string(num_keys));
  }
  const int want_values = expected->values >= 0 ? expected->values : num_keys;
  if (num_values != want_values) {
    return invalid(request, name + " takes " + std::to_string(want_values) + " value(s), got " +
                                std::to_string(num_values));
  }
  if (static_cast<size_t>(num_keys) > limits_.max_keys_per_request) {
    return invalid(request, name + ": " + std::to_string(num_keys) +
                                " keys exceed the server limit of " +
                                std::to_string(limits_.max_keys_per_request) + " per request");
  }
  for (const auto& key : request.keys()) {
    if (key.size() > limits_.max_key_bytes) {
      return invalid(request, name + ": key of " + std::to_string(key.size()) +
                                  " bytes exceeds the server limit of " +
                                  std::to_string(limits_.max_key_bytes) + " bytes");
    }
  }
  return std::nullopt;
}

RendezvousState::Outcome RendezvousState::handle(const std::string& job_id, proto::Request& request,
                                                 const asio::any_io_executor& executor,
                                                 Reply reply) {
  if (auto error = check_limits(request)) return {.response = std::move(error), .waiter = {}};
  std::lock_guard lock(mu_);
  auto& job_ptr = jobs_[job_id];
  if (!job_ptr) job_ptr = std::make_unique<Job>();
  Job& job = *job_ptr;
  if (!is_blocking(request.op())) return {.response = execute(job, request), .waiter = {}};

  auto waiter = std::make_shared<Waiter>();
  waiter->job = job_id;
  waiter->id = request.id();
  waiter->op = request.op();
  waiter->keys.assign(request.keys().begin(), request.keys().end());
  if (!register_waiter(job, waiter)) {
    // Everything is there already: answer now through the same code path.
    std::optional<proto::Response> now;
    waiter->reply = [&now](proto::Response response) { now = std::move(response); };
    complete(job, waiter);
    return {.response = std::move(now), .waiter = {}};
  }
  waiter->reply = std::move(reply);
  ++num_waiters_;
  // The deadline is a timer on the connection's executor: pending waits cost no thread and no
  // polling. A negative timeout behaves as zero (answer TIMEOUT at once).
  waiter->timer = std::make_unique<asio::steady_timer>(executor);
  waiter->timer->expires_after(
      std::chrono::milliseconds(std::max<int64_t>(0, request.timeout_ms())));
  waiter->timer->async_wait([this, weak = std::weak_ptr<Waiter>(waiter)](const auto& error) {
    if (error) return;  // cancelled: the waiter completed or was dropped
    if (auto w = weak.lock()) on_deadline(w);
  });
  return {.response = std::nullopt, .waiter = std::move(waiter)};
}

proto::Response RendezvousState::execute(Job& job, proto::Request& request) {
  proto::Response response;
  response.set_id(request.id());
  auto& values = job.values;
  switch (request.op()) {
    case proto::OP_SET: {
      values[request.keys(0)] = std::move(*request.mutable_values(0));
      notify(job, request.keys(0));
      break;
    }
    case proto::OP_ADD: {
      const auto& key = request.keys(0);
      int64_t current = 0;
      auto it = values.find(key);
      if (it != values.end()) {
        const auto& text = it->second;
        auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), current);
        if (ec != std::errc() || end != text.data() + text.size()) {
          return invalid(request, "OP_ADD: the value of key '" + key + "' is '" + text +
                                      "', not an integer counter");
        }
      }
      int64_t sum = 0;
      if (__builtin_add_overflow(current, request.delta(), &sum)) {
        return invalid(request, "OP_ADD: " + std::to_string(current) + " + " +
                                    std::to_string(request.delta()) + " overflows int64 for key '" +
                                    key + "'");
      }
      values[key] = std::to_string(sum);
      response.set_number(sum);
      notify(job, key);
      break;
    }
    case proto::OP_COMPARE_SET: {
      const auto& key = request.keys(0);
      auto it = values.find(key);
      const bool matches =
          it == values.end() ? request.values(0).empty() : it->second == request.values(0);
      response.set_flag(matches);
      if (matches) {
        auto& slot = values[key];
        slot = std::move(*request.mutable_values(1));
        response.add_values(slot);
        notify(job, key);
      } else {
        response.add_values(it == values.end() ? std::string() : it->second);
      }
      break;
    }
    case proto::OP_CHECK: {
      response.set_flag(std::all_of(request.keys().begin(), request.keys().end(),
                                    [&](const auto& key) { return values.contains(key); }));
      break;
    }
    case proto::OP_DELETE_KEY: {
      const bool existed = values.erase(request.keys(0)) > 0;
      job.deletes += existed ? 1 : 0;
      response.set_flag(existed);
      break;
    }
    case proto::OP_NUM_KEYS:
      response.set_number(static_cast<int64_t>(values.size()));
      break;
    case proto::OP_MULTI_SET: {
      for (int i = 0; i < request.keys_size(); ++i) {
        values[request.keys(i)] = std::move(*request.mutable_values(i));
      }
      for (const auto& key : request.keys()) notify(job, key);
      break;
    }
    case proto::OP_PING:
      break;
    default:
      return invalid(request, "operation " + proto::Op_Name(request.op()) + " not handled");
  }
  return response;
}

bool RendezvousState::register_waiter(Job& job, const std::shared_ptr<Waiter>& waiter) {
  waiter->missing.clear();
  waiter->deletes_seen = job.deletes;
  for (const auto& key : waiter->keys) {
    if (job.values.contains(key)) continue;
    auto& list = job.waiters[key];
    if (!list.empty() && list.back() == waiter) continue;  // a key listed twice counts once
    waiter->missing.push_back(key);
    list.push_back(waiter);
  }
  waiter->remaining = waiter->missing.size();
  return waiter->remaining > 0;
}

void RendezvousState::complete(Job& job, const std::shared_ptr<Waiter>& waiter) {
  // A key seen earlier may have been deleted since: then wait for it again.
  if (job.deletes != waiter->deletes_seen && register_waiter(job, waiter)) return;
  waiter->done = true;
  if (waiter->timer) {
    --num_waiters_;
    waiter->timer->cancel();
  }
  proto::Response response;
  response.set_id(waiter->id);
  if (waiter->op != proto::OP_WAIT) {
    for (const auto& key : waiter->keys) response.add_values(job.values.at(key));
  }
  waiter->reply(std::move(response));
}

void RendezvousState::notify(Job& job, const std::string& key) {
  auto it = job.waiters.find(key);
  if (it == job.waiters.end()) return;
  auto woken = std::move(it->second);
  job.waiters.erase(it);
  for (const auto& waiter : woken) {
    if (waiter->done) continue;
    if (--waiter->remaining == 0) complete(job, waiter);
  }
}

void RendezvousState::on_deadline(const std::shared_ptr<Waiter>& waiter) {
  std::lock_guard lock(mu_);
  if (waiter->done) return;
  waiter->done = true;
  --num_waiters_;
  Job& job = *jobs_.at(waiter->job);
  unregister(job, *waiter);
  proto::Response response;
  response.set_id(waiter->id);
  response.set_status(proto::STATUS_TIMEOUT);
  for (const auto& key : waiter->missing) {
    if (!job.values.contains(key)) response.add_missing_keys(key);
  }
  waiter->reply(std::move(response));
}

void RendezvousState::unregister(Job& job, const Waiter& waiter) {
  for (const auto& key : waiter.missing) {
    auto it = job.waiters.find(key);
    if (it == job.waiters.end()) continue;
    auto& list = it->second;
    std::erase_if(list, [&](const auto& w) { return w.get() == &waiter; });
    if (list.empty()) job.waiters.erase(it);
  }
}

void RendezvousState::drop(const std::shared_ptr<Waiter>& waiter) {
  std::lock_guard lock(mu_);
  if (waiter->done) return;
  waiter->done = true;
  --num_waiters_;
  unregister(*jobs_.at(waiter->job), *waiter);
  waiter->timer->cancel();
}

void RendezvousState::clear() {
  std::lock_guard lock(mu_);
  for (auto& [id, job] : jobs_) {
    for (auto& [key, list] : job->waiters) {
      for (auto& waiter : list) {
        if (waiter->done) continue;
        waiter->done = true;
        waiter->timer->cancel();
      }
    }
  }
  jobs_.clear();
  num_waiters_ = 0;
}

void RendezvousState::erase_job(const std::string& job_id) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  for (auto& [key, list] : it->second->waiters) {
    for (auto& waiter : list) {
      if (waiter->done) continue;
      waiter->done = true;
      waiter->timer->cancel();
      --num_waiters_;
    }
  }
  jobs_.erase(it);
}

size_t RendezvousState::num_jobs() const {
  std::lock_guard lock(mu_);
  return jobs_.size();
}

size_t RendezvousState::num_waiters() const {
  std::lock_guard lock(mu_);
  return num_waiters_;
}

}  // namespace hsgd::comm
