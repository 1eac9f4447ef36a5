#include "comm/rendezvous/detail/tcp_store_journal.h"

namespace hsgd::comm {

bool TcpStoreJournal::record(const proto::Request& request, const proto::Response& response) {
  std::lock_guard lock(mu_);
  switch (request.op()) {
    case proto::OP_SET:
    case proto::OP_MULTI_SET:
      for (int i = 0; i < request.keys_size(); ++i) {
        written_[request.keys(i)] = Written{.value = request.values(i)};
      }
      return true;
    case proto::OP_SET_OWNED:
      written_[request.keys(0)] =
          Written{.value = request.values(0), .owned = true, .linger_ms = request.linger_ms()};
      return true;
    case proto::OP_ADD: {
      Written& w = written_[request.keys(0)];
      w.owned = false;  // the server ended the ownership too
      if (!w.counter && !w.value.empty()) {
        w.value = std::to_string(response.number());  // a value this client set, then added to
      } else {
        w.counter = true;
        w.contribution += request.delta();
      }
      return true;
    }
    case proto::OP_COMPARE_SET:
      if (!response.flag()) return false;
      written_[request.keys(0)] = Written{.value = request.values(1), .won = true};
      return true;
    case proto::OP_DELETE_KEY:
      written_.erase(request.keys(0));
      return false;
    default:
      return false;
  }
}

TcpStoreJournal::Replay TcpStoreJournal::replay(uint64_t max_keys_per_request,
                                                uint64_t max_frame_bytes) const {
  // Room for the request's other fields and the frame header.
  constexpr size_t kOverhead = 1024;
  constexpr size_t kPerKey = 16;
  Replay out;
  proto::Request batch;
  batch.set_op(proto::OP_MULTI_SET);
  size_t batch_bytes = 0;
  auto flush = [&] {
    if (batch.keys_size() == 0) return;
    out.requests.push_back(batch);
    batch.clear_keys();
    batch.clear_values();
    batch_bytes = 0;
  };
  std::lock_guard lock(mu_);
  append_owned(out);
  for (const auto& [key, written] : written_) {
    if (written.owned) continue;
    if (written.won) {
      // First writer wins on the new server too: a key that another client wrote there since
      // (a proposal made before this client was back) is not overwritten.
      proto::Request claim;
      claim.set_op(proto::OP_COMPARE_SET);
      claim.add_keys(key);
      claim.add_values(std::string());
      claim.add_values(written.value);
      out.requests.push_back(std::move(claim));
    } else if (written.counter) {
      if (written.contribution == 0) continue;
      proto::Request add;
      add.set_op(proto::OP_ADD);
      add.add_keys(key);
      add.set_delta(written.contribution);
      out.requests.push_back(std::move(add));
    } else {
      const size_t bytes = key.size() + written.value.size() + kPerKey;
      if (static_cast<uint64_t>(batch.keys_size()) >= max_keys_per_request ||
          batch_bytes + bytes + kOverhead > max_frame_bytes) {
        flush();
      }
      batch.add_keys(key);
      batch.add_values(written.value);
      batch_bytes += bytes;
    }
    ++out.keys;
  }
  flush();
  return out;
}

TcpStoreJournal::Replay TcpStoreJournal::replay_owned() const {
  Replay out;
  std::lock_guard lock(mu_);
  append_owned(out);
  return out;
}

void TcpStoreJournal::append_owned(Replay& out) const {
  for (const auto& [key, written] : written_) {
    if (!written.owned) continue;
    proto::Request set;
    set.set_op(proto::OP_SET_OWNED);
    set.add_keys(key);
    set.add_values(written.value);
    set.set_linger_ms(written.linger_ms);
    out.requests.push_back(std::move(set));
    ++out.keys;
  }
}

}  // namespace hsgd::comm
