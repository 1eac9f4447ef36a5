// RendezvousState's pending waits: a get/wait/multi_get is answered now or joins the KeySet of its
// keys (wait, handle_known_keys, join), a write wakes the KeySets of its key (notify, complete),
// and the deadline timer or a closed connection takes a waiter out (on_deadline, drop).

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "comm/rendezvous/detail/rendezvous_state.h"
#include "comm/rendezvous/detail/rendezvous_state_job.h"

namespace hsgd::comm {

namespace {

using Keys = google::protobuf::RepeatedPtrField<std::string>;

// Field 3 (keys) of a Request, length-delimited: (3 << 3) | 2.
constexpr uint8_t kKeysTag = 0x1a;

size_t key_set_hash(std::string_view wire, bool values) {
  return std::hash<std::string_view>{}(wire) ^ (values ? 0x9e3779b97f4a7c15ULL : 0);
}

bool same_keys(const RendezvousState::KeySet& set, size_t hash, bool values,
               std::string_view wire) {
  return set.hash == hash && set.values == values && set.wire == wire;
}

// The answer of an answered KeySet to the request with this id.
RendezvousAnswer answer_of(uint64_t id, const RendezvousState::KeySet& set) {
  RendezvousAnswer answer{.response = {}, .shared = set.body};
  answer.response.set_id(id);
  return answer;
}

RendezvousAnswer refusal(const RendezvousState::BlockingRequest& request, std::string error) {
  RendezvousAnswer answer;
  answer.response.set_id(request.id);
  answer.response.set_status(proto::STATUS_INVALID_ARGUMENT);
  answer.response.set_error(proto::Op_Name(request.op) + ": " + error);
  return answer;
}

}  // namespace

std::string RendezvousState::encode_keys_wire(const Keys& keys) {
  std::string wire;
  {
    google::protobuf::io::StringOutputStream stream(&wire);
    google::protobuf::io::CodedOutputStream out(&stream);
    for (const auto& key : keys) {
      out.WriteTag(kKeysTag);
      out.WriteVarint32(static_cast<uint32_t>(key.size()));
      out.WriteString(key);
    }
  }  // the stream writes its last bytes when destroyed
  return wire;
}

std::optional<RendezvousState::Outcome> RendezvousState::handle_known_keys(
    const std::string& job_id, const BlockingRequest& request,
    const asio::any_io_executor& executor, Reply reply) {
  std::lock_guard lock(mu_);
  const auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return std::nullopt;
  Job& job = *it->second;
  const bool values = request.op != proto::OP_WAIT;
  auto set = find_key_set(job, key_set_hash(request.keys_wire, values), values, request.keys_wire);
  // A get of several keys is refused by the parsed path, naming its arity.
  if (!set || (request.op == proto::OP_GET && set->keys.size() != 1)) return std::nullopt;
  return join(job, set, /*is_new=*/false, request, executor, std::move(reply));
}

RendezvousState::Outcome RendezvousState::wait(Job& job, proto::Request& request,
                                               const asio::any_io_executor& executor, Reply reply) {
  std::string wire = encode_keys_wire(request.keys());
  const BlockingRequest blocking{.id = request.id(),
                                 .op = request.op(),
                                 .timeout_ms = request.timeout_ms(),
                                 .keys_wire = wire};
  const bool values = request.op() != proto::OP_WAIT;
  const size_t hash = key_set_hash(wire, values);
  if (auto set = find_key_set(job, hash, values, wire)) {
    return join(job, set, /*is_new=*/false, blocking, executor, std::move(reply));
  }
  auto set = std::make_shared<KeySet>();
  set->keys.assign(std::make_move_iterator(request.mutable_keys()->begin()),
                   std::make_move_iterator(request.mutable_keys()->end()));
  set->wire = std::move(wire);
  set->values = values;
  set->hash = hash;
  if (!register_keys(job, set)) encode_answer(job, set);  // every key exists: answered now
  return join(job, set, /*is_new=*/set->pending, blocking, executor, std::move(reply));
}

std::shared_ptr<RendezvousState::KeySet> RendezvousState::find_key_set(
    const Job& job, size_t hash, bool values, std::string_view wire) const {
  // The last answer stands while nothing was written since (store_value and erase_value drop it).
  if (job.answered && same_keys(*job.answered, hash, values, wire)) return job.answered;
  const auto [begin, end] = job.pending.equal_range(hash);
  for (auto it = begin; it != end; ++it) {
    if (same_keys(*it->second, hash, values, wire)) return it->second;
  }
  return nullptr;
}

RendezvousState::Outcome RendezvousState::join(Job& job, const std::shared_ptr<KeySet>& set,
                                               bool is_new, const BlockingRequest& request,
                                               const asio::any_io_executor& executor, Reply reply) {
  // 1. Every key exists: the encoded answer.
  if (!set->pending) return {.answer = answer_of(request.id, *set), .waiter = {}};
  // 2. Within the job's quotas: a new KeySet holds copies of its keys (twice at most: keys and
  //    missing); a waiter joining one adds no key.
  size_t charge = 0;
  if (is_new) {
    for (const auto& key : set->keys) charge += 2 * key.size();
  }
  if (auto why = check_wait_quota(job, charge)) {
    if (is_new) unregister(job, set);
    return {.answer = refusal(request, *why), .waiter = {}};
  }
  if (is_new) {
    set->charged_bytes = charge;
    job.bytes += charge;
    job.pending.emplace(set->hash, set);
  }
  auto waiter = std::make_shared<Waiter>();
  waiter->job = job.id;
  waiter->id = request.id;
  waiter->keys = set;
  waiter->index = set->waiters.size();
  waiter->reply = std::move(reply);
  set->waiters.push_back(waiter);
  ++job.num_waiters;
  ++num_waiters_;
  // 3. The deadline is a timer on the connection's executor: pending waits cost no thread and no
  //    polling. A negative timeout behaves as zero (answer TIMEOUT at once); one beyond a year
  //    is a year, since now + 2^63 ms overflows the clock (and would time out at once).
  waiter->timer = std::make_unique<asio::steady_timer>(executor);
  waiter->timer->expires_after(
      std::chrono::milliseconds(std::clamp<int64_t>(request.timeout_ms, 0, kMaxWaitTimeoutMs)));
  waiter->timer->async_wait([this, weak = std::weak_ptr<Waiter>(waiter)](const auto& error) {
    if (error) return;  // cancelled: the waiter completed or was dropped
    if (auto w = weak.lock()) on_deadline(w);
  });
  return {.answer = std::nullopt, .waiter = std::move(waiter)};
}

bool RendezvousState::register_keys(Job& job, const std::shared_ptr<KeySet>& set) {
  set->missing.clear();
  set->deletes_seen = job.deletes;
  for (const auto& key : set->keys) {
    if (job.values.contains(key)) continue;
    auto& list = job.waiters[key];
    if (!list.empty() && list.back() == set) continue;  // a key listed twice counts once
    set->missing.push_back(key);
    list.push_back(set);
  }
  set->remaining = set->missing.size();
  set->pending = set->remaining > 0;
  return set->pending;
}

void RendezvousState::unregister(Job& job, const std::shared_ptr<KeySet>& set) {
  for (const auto& key : set->missing) {
    auto it = job.waiters.find(key);
    if (it == job.waiters.end()) continue;
    std::erase(it->second, set);
    if (it->second.empty()) job.waiters.erase(it);
  }
  const auto [begin, end] = job.pending.equal_range(set->hash);
  for (auto it = begin; it != end; ++it) {
    if (it->second == set) {
      job.pending.erase(it);
      break;
    }
  }
  job.bytes -= set->charged_bytes;
  set->charged_bytes = 0;
  set->pending = false;
}

void RendezvousState::complete(Job& job, const std::shared_ptr<KeySet>& set) {
  // A key seen earlier may have been deleted since: then wait for it again.
  if (job.deletes != set->deletes_seen && register_keys(job, set)) return;
  unregister(job, set);  // no key list holds it any more: this leaves the pending KeySets
  encode_answer(job, set);
  auto waiters = std::move(set->waiters);
  set->waiters.clear();
  for (const auto& waiter : waiters) {
    waiter->done = true;
    waiter->keys.reset();
    waiter->timer->cancel();
    --job.num_waiters;
    --num_waiters_;
    waiter->reply(answer_of(waiter->id, *set));
  }
}

void RendezvousState::encode_answer(Job& job, const std::shared_ptr<KeySet>& set) {
  set->missing.clear();
  if (set->values) {
    proto::Response values;
    for (const auto& key : set->keys) values.add_values(job.values.at(key));
    set->body = std::make_shared<const std::string>(values.SerializeAsString());
  }
  job.answered = set;
}

void RendezvousState::notify(Job& job, const std::string& key) {
  auto it = job.waiters.find(key);
  if (it == job.waiters.end()) return;
  auto woken = std::move(it->second);
  job.waiters.erase(it);
  for (const auto& set : woken) {
    if (set->pending && --set->remaining == 0) complete(job, set);
  }
}

void RendezvousState::on_deadline(const std::shared_ptr<Waiter>& waiter) {
  std::lock_guard lock(mu_);
  if (waiter->done) return;
  waiter->done = true;
  Job& job = *jobs_.at(waiter->job);
  const std::shared_ptr<KeySet> set = waiter->keys;
  leave(job, *waiter);
  proto::Response response;
  response.set_id(waiter->id);
  response.set_status(proto::STATUS_TIMEOUT);
  for (const auto& key : set->missing) {
    if (!job.values.contains(key)) response.add_missing_keys(key);
  }
  waiter->reply(RendezvousAnswer{.response = std::move(response), .shared = {}});
}

void RendezvousState::leave(Job& job, Waiter& waiter) {
  const std::shared_ptr<KeySet> set = std::move(waiter.keys);
  auto& waiters = set->waiters;
  // Swap-remove: the order of a KeySet's waiters does not matter, each has its own reply.
  if (waiter.index + 1 != waiters.size()) {
    waiters[waiter.index] = std::move(waiters.back());
    waiters[waiter.index]->index = waiter.index;
  }
  waiters.pop_back();
  --job.num_waiters;
  --num_waiters_;
  if (waiters.empty()) unregister(job, set);
}

void RendezvousState::drop(const std::shared_ptr<Waiter>& waiter) {
  std::lock_guard lock(mu_);
  if (waiter->done) return;
  waiter->done = true;
  leave(*jobs_.at(waiter->job), *waiter);
  waiter->timer->cancel();
}

}  // namespace hsgd::comm
