#include "comm/rendezvous/detail/rendezvous_state.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <random>
#include <utility>

#include "comm/rendezvous/detail/rendezvous_state_job.h"

// Requests and jobs: handle() routes a request, execute() answers one that does not block, and
// the job table's upkeep (clear, erase_job, counts). Limits and quotas are in
// rendezvous_state_limits.cpp, pending waits in rendezvous_state_waiters.cpp.

namespace hsgd::comm {

using rendezvous_state_detail::invalid;

namespace {

bool is_blocking(proto::Op op) {
  return op == proto::OP_GET || op == proto::OP_WAIT || op == proto::OP_MULTI_GET;
}

// Owners of different jobs are distinct (a job id holds no NUL: see job_id_problem).
std::string owner_key(const std::string& job, const std::string& owner) {
  return job + '\0' + owner;
}

}  // namespace

namespace {

uint64_t new_instance() {
  std::random_device device;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{device()} << 32) ^ device();
  return id;
}

}  // namespace

RendezvousState::RendezvousState(RendezvousLimits limits)
    : limits_(limits), instance_(new_instance()) {}

RendezvousState::~RendezvousState() { clear(); }

RendezvousState::Outcome RendezvousState::handle(const std::string& job_id, proto::Request& request,
                                                 const asio::any_io_executor& executor, Reply reply,
                                                 const std::string& owner) {
  const auto now = [](proto::Response response) {
    return Outcome{.answer = RendezvousAnswer{.response = std::move(response), .shared = {}},
                   .waiter = {}};
  };
  if (auto error = check_limits(request)) return now(std::move(*error));
  std::lock_guard lock(mu_);
  auto& job_ptr = jobs_[job_id];
  if (!job_ptr) {
    if (jobs_.size() > limits_.max_jobs) {
      jobs_.erase(job_id);
      return now(invalid(request, "the server holds the keys of " +
                                      std::to_string(limits_.max_jobs) + " jobs, its limit (" +
                                      limits_.names.max_jobs + "); job '" + job_id +
                                      "' cannot be added"));
    }
    job_ptr = std::make_unique<Job>();
    job_ptr->id = job_id;
  }
  Job& job = *job_ptr;
  if (is_blocking(request.op())) return wait(job, request, executor, std::move(reply));
  if (auto error = check_quota(job_id, job, request)) return now(std::move(*error));
  return now(execute(job, request, owner));
}

proto::Response RendezvousState::execute(Job& job, proto::Request& request,
                                         const std::string& owner) {
  proto::Response response;
  response.set_id(request.id());
  auto& values = job.values;
  switch (request.op()) {
    case proto::OP_SET: {
      store_value(job, request.keys(0), std::move(*request.mutable_values(0)));
      notify(job, request.keys(0));
      break;
    }
    case proto::OP_SET_OWNED: {
      // The owner is attached (its connection sent this), so its record exists.
      const auto it = owner.empty() ? owners_.end() : owners_.find(owner_key(job.id, owner));
      if (it == owners_.end()) {
        return invalid(request,
                       "OP_SET_OWNED needs an owner, named in the connection's Hello; none was");
      }
      it->second.linger_ms = std::clamp<int64_t>(request.linger_ms(), 0, kMaxWaitTimeoutMs);
      store_value(job, request.keys(0), std::move(*request.mutable_values(0)));
      job.owner_of[request.keys(0)] = owner;
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

void RendezvousState::attach(const std::string& job, const std::string& owner) {
  if (owner.empty()) return;
  std::lock_guard lock(mu_);
  Owner& o = owners_[owner_key(job, owner)];
  ++o.connections;
  if (o.expiry) {
    o.expiry->cancel();  // back before its keys expired: they stay
    o.expiry.reset();
  }
}

void RendezvousState::detach(const std::string& job, const std::string& owner,
                             const asio::any_io_executor& executor) {
  if (owner.empty()) return;
  std::lock_guard lock(mu_);
  const std::string id = owner_key(job, owner);
  const auto it = owners_.find(id);
  if (it == owners_.end() || it->second.connections == 0) return;
  Owner& o = it->second;
  if (--o.connections > 0) return;
  const auto job_it = jobs_.find(job);
  const bool owns = job_it != jobs_.end() &&
                    std::any_of(job_it->second->owner_of.begin(), job_it->second->owner_of.end(),
                                [&](const auto& entry) { return entry.second == owner; });
  if (!owns) {
    owners_.erase(it);
    return;
  }
  o.expiry = std::make_unique<asio::steady_timer>(executor);
  o.expiry->expires_after(std::chrono::milliseconds(o.linger_ms));
  o.expiry->async_wait([this, job, owner](const auto& error) {
    if (error) return;  // cancelled: a connection of the owner opened again, or clear()
    std::lock_guard lock(mu_);
    const auto again = owners_.find(owner_key(job, owner));
    if (again == owners_.end() || again->second.connections > 0) return;
    expire_owned(job, owner);
    owners_.erase(again);
  });
}

void RendezvousState::expire_owned(const std::string& job_id, const std::string& owner) {
  const auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = *it->second;
  std::vector<std::string> keys;
  for (const auto& [key, by] : job.owner_of) {
    if (by == owner) keys.push_back(key);
  }
  for (const auto& key : keys) job.deletes += erase_value(job, key) ? 1 : 0;
}

void RendezvousState::clear() {
  std::lock_guard lock(mu_);
  for (auto& [id, o] : owners_) {
    if (o.expiry) o.expiry->cancel();
  }
  owners_.clear();
  for (auto& [id, job] : jobs_) end_waits(*job);
  jobs_.clear();
  num_waiters_ = 0;
}

void RendezvousState::erase_job(const std::string& job_id) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  num_waiters_ -= it->second->num_waiters;
  end_waits(*it->second);
  jobs_.erase(it);
}

void RendezvousState::end_waits(Job& job) {
  for (auto& [hash, set] : job.pending) {
    for (auto& waiter : set->waiters) {
      waiter->done = true;
      waiter->keys.reset();
      waiter->timer->cancel();
    }
    set->waiters.clear();
  }
  job.pending.clear();
  job.waiters.clear();
  job.num_waiters = 0;
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
