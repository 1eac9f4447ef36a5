// RendezvousState's pending waits: a get/wait/multi_get registers on its missing keys, a write
// wakes them (notify, complete), and the deadline timer or a closed connection ends them
// (on_deadline, drop).

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "comm/rendezvous/detail/rendezvous_state.h"
#include "comm/rendezvous/detail/rendezvous_state_job.h"

namespace hsgd::comm {

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

}  // namespace hsgd::comm
