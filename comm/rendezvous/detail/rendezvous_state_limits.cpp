// RendezvousState's limits: the shape and size checks of a request (check_limits) and a job's
// key and byte quotas (check_quota), with the bookkeeping that keeps a job's byte count
// (store_value, erase_value).

#include <optional>
#include <string>
#include <utility>

#include "comm/rendezvous/detail/rendezvous_state.h"
#include "comm/rendezvous/detail/rendezvous_state_job.h"

namespace hsgd::comm {

using rendezvous_state_detail::invalid;

namespace {

// The longest decimal int64 ("-9223372036854775808"): what an OP_ADD counter may come to hold.
constexpr size_t kCounterBytes = 20;

// Expected number of keys and values of each op (-1: any number, values must match keys).
struct Arity {
  int keys;
  int values;
};

std::optional<Arity> arity(proto::Op op) {
  switch (op) {
    case proto::OP_SET:
    case proto::OP_SET_OWNED:
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
    case proto::OP_SET_OWNED:
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
                                std::to_string(limits_.max_keys_per_job) + " keys per job (" +
                                limits_.names.max_keys_per_job + ")");
  }
  if (bytes > static_cast<int64_t>(limits_.max_job_bytes) &&
      bytes > static_cast<int64_t>(job.bytes)) {
    return invalid(request, name + ": job '" + job_id + "' would hold " + std::to_string(bytes) +
                                " bytes of keys, values and pending waits; the server allows " +
                                std::to_string(limits_.max_job_bytes) + " bytes per job (" +
                                limits_.names.max_job_bytes + ")");
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
  job.owner_of.erase(key);  // OP_SET_OWNED owns it again right after
  job.answered.reset();     // it may hold the old value
}

bool RendezvousState::erase_value(Job& job, const std::string& key) {
  const auto it = job.values.find(key);
  if (it == job.values.end()) return false;
  job.bytes -= key.size() + it->second.size();
  job.values.erase(it);
  job.owner_of.erase(key);
  job.answered.reset();  // it may hold the key
  return true;
}

std::optional<std::string> RendezvousState::check_wait_quota(const Job& job, size_t charge) const {
  if (job.num_waiters >= limits_.max_waits_per_job) {
    return "job '" + job.id + "' has " + std::to_string(job.num_waiters) +
           " pending waits, the server's limit per job (" + limits_.names.max_waits_per_job + ")";
  }
  if (job.bytes + charge > limits_.max_job_bytes) {
    return "job '" + job.id + "' would hold " + std::to_string(job.bytes + charge) +
           " bytes of keys, values and pending waits; the server allows " +
           std::to_string(limits_.max_job_bytes) + " bytes per job (" +
           limits_.names.max_job_bytes + ")";
  }
  return std::nullopt;
}

}  // namespace hsgd::comm
