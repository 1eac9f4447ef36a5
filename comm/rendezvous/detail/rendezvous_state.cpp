#include "comm/rendezvous/detail/rendezvous_state.h"

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
  size_t charged_bytes = 0;   // its share of Job::bytes while pending (its key copies)
  Reply reply;
  std::unique_ptr<asio::steady_timer> timer;
};

struct RendezvousState::Job {
  std::unordered_map<std::string, std::string> values;
  std::unordered_map<std::string, std::vector<std::shared_ptr<Waiter>>> waiters;
  uint64_t deletes = 0;  // keys deleted so far: a waiter re-checks its keys only if this moved
  size_t bytes = 0;      // keys + values stored, plus the keys of pending waiters
  size_t num_waiters = 0;
};

namespace {

proto::Response invalid(const proto::Request& request, std::string error) {
  proto::Response response;
  response.set_id(request.id());
  response.set_status(proto::STATUS_INVALID_ARGUMENT);
  response.set_error(std::move(error));
  return response;
}

// The longest decimal int64 ("-9223372036854775808"): what an OP_ADD counter may come to hold.
constexpr size_t kCounterBytes = 20;

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

std::optional<proto::Response> RendezvousState::check_quota(const std::string& job_id,
                                                            const Job& job,
                                                            const proto::Request& request) const {
  // What the job would hold afterwards. A key written twice by one multi_set counts twice: an
  // over-estimate only refuses earlier, never lets a job past its quota.
  int64_t keys = static_cast<int64_t>(job.values.size());
  int64_t bytes = static_cast<int64_t>(job.bytes);
  auto write = [&](const std::string& key, size_t value_bytes) {
    const auto it = job.values.find(key);
    if (it == job.values.end()) {
      keys += 1;
      bytes += static_cast<int64_t>(key.size() + value_bytes);
    } else {
      bytes += static_cast<int64_t>(value_bytes) - static_cast<int64_t>(it->second.size());
    }
  };
  switch (request.op()) {
    case proto::OP_SET:
      write(request.keys(0), request.values(0).size());
      break;
    case proto::OP_ADD:
      write(request.keys(0), kCounterBytes);
      break;
    case proto::OP_COMPARE_SET:
      write(request.keys(0), request.values(1).size());
      break;
    case proto::OP_MULTI_SET:
      for (int i = 0; i < request.keys_size(); ++i)
        write(request.keys(i), request.values(i).size());
      break;
    default:
      return std::nullopt;  // reads and deletes never grow a job
  }
  const auto& name = proto::Op_Name(request.op());
  if (keys > static_cast<int64_t>(limits_.max_keys_per_job) &&
      keys > static_cast<int64_t>(job.values.size())) {
    return invalid(request, name + ": job '" + job_id + "' would hold " + std::to_string(keys) +
                                " keys; the server allows " +
                                std::to_string(limits_.max_keys_per_job) +
                                " keys per job (--max-keys-per-job)");
  }
  if (bytes > static_cast<int64_t>(limits_.max_job_bytes) &&
      bytes > static_cast<int64_t>(job.bytes)) {
    return invalid(request, name + ": job '" + job_id + "' would hold " + std::to_string(bytes) +
                                " bytes of keys, values and pending waits; the server allows " +
                                std::to_string(limits_.max_job_bytes) +
                                " bytes per job (--max-job-bytes)");
  }
  return std::nullopt;
}

void RendezvousState::store_value(Job& job, const std::string& key, std::string value) {
  auto [it, inserted] = job.values.try_emplace(key);
  if (inserted) {
    job.bytes += key.size();
  } else {
    job.bytes -= it->second.size();
  }
  job.bytes += value.size();
  it->second = std::move(value);
}

bool RendezvousState::erase_value(Job& job, const std::string& key) {
  const auto it = job.values.find(key);
  if (it == job.values.end()) return false;
  job.bytes -= key.size() + it->second.size();
  job.values.erase(it);
  return true;
}

void RendezvousState::release(Job& job, Waiter& waiter) {
  job.bytes -= waiter.charged_bytes;
  waiter.charged_bytes = 0;
  --job.num_waiters;
  --num_waiters_;
}

RendezvousState::Outcome RendezvousState::handle(const std::string& job_id, proto::Request& request,
                                                 const asio::any_io_executor& executor,
                                                 Reply reply) {
  if (auto error = check_limits(request)) return {.response = std::move(error), .waiter = {}};
  std::lock_guard lock(mu_);
  auto& job_ptr = jobs_[job_id];
  if (!job_ptr) {
    if (jobs_.size() > limits_.max_jobs) {
      jobs_.erase(job_id);
      return {
          .response = invalid(
              request, "the server holds the keys of " + std::to_string(limits_.max_jobs) +
                           " jobs, its limit (--max-jobs); job '" + job_id + "' cannot be added"),
          .waiter = {}};
    }
    job_ptr = std::make_unique<Job>();
  }
  Job& job = *job_ptr;
  if (!is_blocking(request.op())) {
    if (auto error = check_quota(job_id, job, request)) {
      return {.response = std::move(error), .waiter = {}};
    }
    return {.response = execute(job, request), .waiter = {}};
  }

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
  // The waiter holds copies of its keys (twice at most: keys and missing).
  size_t charge = 0;
  for (const auto& key : waiter->keys) charge += 2 * key.size();
  std::optional<std::string> refusal;
  if (job.num_waiters >= limits_.max_waits_per_job) {
    refusal = "job '" + job_id + "' has " + std::to_string(job.num_waiters) +
              " pending waits, the server's limit per job (--max-waits-per-job)";
  } else if (job.bytes + charge > limits_.max_job_bytes) {
    refusal = "job '" + job_id + "' would hold " + std::to_string(job.bytes + charge) +
              " bytes of keys, values and pending waits; the server allows " +
              std::to_string(limits_.max_job_bytes) + " bytes per job (--max-job-bytes)";
  }
  if (refusal) {
    unregister(job, *waiter);
    return {.response = invalid(request, proto::Op_Name(request.op()) + ": " + *refusal),
            .waiter = {}};
  }
  waiter->reply = std::move(reply);
  waiter->charged_bytes = charge;
  job.bytes += charge;
  ++job.num_waiters;
  ++num_waiters_;
  // The deadline is a timer on the connection's executor: pending waits cost no thread and no
  // polling. A negative timeout behaves as zero (answer TIMEOUT at once); one beyond a year is a
  // year, since now + 2^63 ms overflows the clock (and would time out at once).
  waiter->timer = std::make_unique<asio::steady_timer>(executor);
  waiter->timer->expires_after(
      std::chrono::milliseconds(std::clamp<int64_t>(request.timeout_ms(), 0, kMaxWaitTimeoutMs)));
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
      store_value(job, request.keys(0), std::move(*request.mutable_values(0)));
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
      store_value(job, key, std::to_string(sum));
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
        store_value(job, key, std::move(*request.mutable_values(1)));
        response.add_values(values.at(key));
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
      const bool existed = erase_value(job, request.keys(0));
      job.deletes += existed ? 1 : 0;
      response.set_flag(existed);
      break;
    }
    case proto::OP_NUM_KEYS:
      response.set_number(static_cast<int64_t>(values.size()));
      break;
    case proto::OP_MULTI_SET: {
      for (int i = 0; i < request.keys_size(); ++i) {
        store_value(job, request.keys(i), std::move(*request.mutable_values(i)));
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
    release(job, *waiter);
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
  Job& job = *jobs_.at(waiter->job);
  release(job, *waiter);
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
  Job& job = *jobs_.at(waiter->job);
  release(job, *waiter);
  unregister(job, *waiter);
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
