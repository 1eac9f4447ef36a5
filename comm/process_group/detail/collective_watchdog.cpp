#include "comm/process_group/detail/collective_watchdog.h"

#include <algorithm>
#include <map>
#include <optional>
#include <sstream>

#include "comm/error.h"
#include "comm/format_ranks.h"
#include "comm/log.h"

namespace hsgd::detail {
namespace {

using Clock = std::chrono::steady_clock;

std::string waiting_key(const std::string& prefix, int rank) {
  return prefix + "waiting/" + std::to_string(rank);
}

std::string mismatch_key(const std::string& prefix) { return prefix + "mismatch"; }

// The value of key, or nullopt when it does not exist (or vanished between check and get).
std::optional<std::string> try_get(comm::Store& store, const std::string& key) {
  if (!store.check({key})) return std::nullopt;
  try {
    return comm::to_string(store.get(key, std::chrono::milliseconds(200)));
  } catch (const Timeout&) {
    return std::nullopt;
  }
}

// "<ids>\n<message>" -> the report as seen by rank.
std::shared_ptr<MismatchReport> parse_report(const std::string& stored, int rank) {
  const size_t newline = stored.find('\n');
  if (newline == std::string::npos) return nullptr;
  std::vector<int> ids;
  std::stringstream in(stored.substr(0, newline));
  for (std::string id; std::getline(in, id, ',');) ids.push_back(std::stoi(id));
  auto report = std::make_shared<MismatchReport>();
  report->message = stored.substr(newline + 1);
  if (rank >= 0 && rank < static_cast<int>(ids.size()) && ids[static_cast<size_t>(rank)] >= 0) {
    for (size_t r = 0; r < ids.size(); ++r) {
      if (ids[r] == ids[static_cast<size_t>(rank)])
        report->same_ranks.push_back(static_cast<int>(r));
    }
  }
  return report;
}

}  // namespace

std::shared_ptr<const MismatchReport> stored_mismatch(comm::Store& store,
                                                      const std::string& key_prefix, int rank) {
  try {
    const auto stored = try_get(store, mismatch_key(key_prefix));
    return stored ? parse_report(*stored, rank) : nullptr;
  } catch (const std::exception&) {
    return nullptr;
  }
}

std::string CollectiveWatchdog::left_key(const std::string& key_prefix, int rank) {
  return key_prefix + "left/" + std::to_string(rank);
}

CollectiveWatchdog::CollectiveWatchdog(Config config, OnMismatch on_mismatch)
    : config_(std::move(config)),
      on_mismatch_(std::move(on_mismatch)),
      poll_(std::max<comm::Duration>(config_.threshold / 4, std::chrono::milliseconds(10))),
      other_seq_(static_cast<size_t>(config_.size)) {
  thread_ = std::thread([this] { loop(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CollectiveWatchdog::begin(const CollectiveFingerprint& fp) {
  const uint32_t hash = fp.shape_hash();
  std::lock_guard<std::mutex> lock(mu_);
  running_ = true;
  current_ = fp;
  since_ = Clock::now();
  history_[fp.seq % kHistory] = Begun{.valid = true, .seq = fp.seq, .hash = hash};
}

void CollectiveWatchdog::end() {
  std::lock_guard<std::mutex> lock(mu_);
  running_ = false;
}

std::shared_ptr<const MismatchReport> CollectiveWatchdog::found() const {
  std::lock_guard<std::mutex> lock(mu_);
  return found_;
}

void CollectiveWatchdog::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    wake_.wait_for(lock, poll_);
    if (stopping_) break;
    const comm::Duration waited = std::chrono::duration_cast<comm::Duration>(Clock::now() - since_);
    const bool overdue = running_ && !found_ && waited >= config_.threshold;
    const CollectiveFingerprint fp = overdue ? current_ : CollectiveFingerprint{};
    const bool ended = published_ && (!running_ || current_.seq != published_seq_);
    lock.unlock();
    try {
      if (ended) {
        config_.store->delete_key(waiting_key(config_.key_prefix, config_.rank));
        published_ = false;
      }
      if (overdue) watch(fp, waited);
    } catch (const std::exception& e) {
      // The store may be gone (the job is ending); the collective's own timeout still holds.
      comm::logger()->debug("group '{}': collective watchdog: {}", config_.group_name, e.what());
    }
    lock.lock();
  }
  lock.unlock();
  if (published_) {
    try {
      config_.store->delete_key(waiting_key(config_.key_prefix, config_.rank));
    } catch (const std::exception&) {
    }
  }
}

void CollectiveWatchdog::watch(const CollectiveFingerprint& mine, comm::Duration waited) {
  if (!published_) {
    config_.store->set(
        waiting_key(config_.key_prefix, config_.rank),
        comm::to_bytes(str_cat(mine.seq, "|", mine.shape_hash(), "|", mine.describe())));
    published_ = true;
    published_seq_ = mine.seq;
    noted_ = false;
    std::fill(other_seq_.begin(), other_seq_.end(), OtherSeq{});
  }
  const std::vector<Peer> now = read_peers();
  if (!conflicts(mine, now)) {
    if (!noted_ && waited >= kSilentNote * config_.threshold) note_silent(mine, now, waited);
    // A member that found a mismatch first stored its report and aborted its transport; its
    // collective then failed and its key was deleted, possibly before this rank read it. Its
    // report still holds: the group is broken (a shared-memory collective is not woken by the
    // peers' abort, so this rank aborts too).
    if (auto report = stored_mismatch(*config_.store, config_.key_prefix, config_.rank)) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        found_ = report;
      }
      on_mismatch_(*report);
    }
    return;
  }
  // Let every rank that waits publish (each does within threshold + poll), so that all build
  // the report from the same keys; then the first to store it wins and everyone uses that one.
  {
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait_for(lock, config_.threshold + poll_, [&] { return stopping_; });
    if (stopping_ || !running_ || current_.seq != mine.seq) return;  // it completed after all
  }
  const std::vector<Peer> peers = read_peers();
  if (!conflicts(mine, peers)) return;
  const std::string key = mismatch_key(config_.key_prefix);
  const comm::CompareSetResult stored =
      config_.store->compare_set(key, {}, comm::to_bytes(describe(mine, peers)));
  std::shared_ptr<const MismatchReport> report =
      parse_report(comm::to_string(stored.current), config_.rank);
  if (report == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    found_ = report;
  }
  on_mismatch_(*report);
}

void CollectiveWatchdog::note_silent(const CollectiveFingerprint& mine,
                                     const std::vector<Peer>& peers, comm::Duration waited) {
  noted_ = true;
  std::vector<int> silent;
  std::vector<int> with_me;
  for (int r = 0; r < config_.size; ++r) {
    const Peer& peer = peers[static_cast<size_t>(r)];
    if (r == config_.rank || (peer.waiting && peer.seq == mine.seq)) {
      with_me.push_back(r);
    } else if (!peer.waiting && !peer.left) {
      silent.push_back(r);
    }
  }
  if (silent.empty()) return;
  comm::logger()->warn(
      "group '{}' (rank {} of {}): {} has waited {} ms; {} published no collective of this "
      "group (computing, waiting elsewhere, or unreachable: a lost link or host); {} {} in it",
      config_.group_name, config_.rank, config_.size, mine.describe(), waited.count(),
      describe_rank_set(silent), describe_rank_set(with_me), with_me.size() == 1 ? "is" : "are");
}

std::vector<CollectiveWatchdog::Peer> CollectiveWatchdog::read_peers() {
  std::vector<Peer> peers(static_cast<size_t>(config_.size));
  for (int r = 0; r < config_.size; ++r) {
    if (r == config_.rank) continue;
    Peer& peer = peers[static_cast<size_t>(r)];
    if (auto value = try_get(*config_.store, waiting_key(config_.key_prefix, r))) {
      const size_t a = value->find('|');
      const size_t b = value->find('|', a == std::string::npos ? a : a + 1);
      if (a != std::string::npos && b != std::string::npos) {
        peer.waiting = true;
        peer.seq = std::stoull(value->substr(0, a));
        peer.hash = static_cast<uint32_t>(std::stoul(value->substr(a + 1, b - a - 1)));
        peer.what = value->substr(b + 1);
      }
    }
    if (auto value = try_get(*config_.store, left_key(config_.key_prefix, r))) {
      peer.left = true;
      peer.left_seq = std::stoull(*value);
    }
  }
  return peers;
}

bool CollectiveWatchdog::conflicts(const CollectiveFingerprint& mine,
                                   const std::vector<Peer>& peers) {
  bool conflict = false;
  const auto now = Clock::now();
  for (int r = 0; r < config_.size; ++r) {
    if (r == config_.rank) continue;
    const Peer& peer = peers[static_cast<size_t>(r)];
    OtherSeq& other = other_seq_[static_cast<size_t>(r)];
    if (peer.left && peer.left_seq <= mine.seq) conflict = true;
    if (!peer.waiting || peer.seq == mine.seq) {
      other = OtherSeq{};
      if (peer.waiting && peer.hash != mine.shape_hash()) conflict = true;
      continue;
    }
    // Waiting at another seq: a key its collective may just be deleting, unless it stays.
    const bool first_seen = other.when == Clock::time_point{} || other.seq != peer.seq;
    if (first_seen) other = OtherSeq{.seq = peer.seq, .when = now};
    // A member ahead of this rank checks this rank against its own history.
    if (peer.seq > mine.seq) continue;
    if (hash_at(peer.seq) == peer.hash) {
      if (first_seen) {
        comm::logger()->debug(
            "group '{}' (rank {} of {}): rank {} is still in {}, which this rank completed; "
            "this rank is in {}",
            config_.group_name, config_.rank, config_.size, r, peer.what, mine.describe());
      }
      continue;
    }
    if (!first_seen && now - other.when >= config_.threshold) conflict = true;
  }
  return conflict;
}

std::optional<uint32_t> CollectiveWatchdog::hash_at(uint64_t seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Begun& begun = history_[seq % kHistory];
  if (!begun.valid || begun.seq != seq) return std::nullopt;
  return begun.hash;
}

std::string CollectiveWatchdog::describe(const CollectiveFingerprint& mine,
                                         const std::vector<Peer>& peers) const {
  // The sets of ranks waiting in one collective (seq and shape), by lowest rank.
  struct Set {
    std::string what;
    std::vector<int> ranks;
  };
  std::vector<Set> sets;
  std::map<std::pair<uint64_t, uint32_t>, size_t> index;
  std::vector<int> ids(static_cast<size_t>(config_.size), -1);
  std::vector<int> left;
  std::vector<int> silent;
  for (int r = 0; r < config_.size; ++r) {
    const Peer& peer = peers[static_cast<size_t>(r)];
    const bool me = r == config_.rank;
    if (!me && !peer.waiting) {
      (peer.left ? left : silent).push_back(r);
      continue;
    }
    const auto key =
        me ? std::make_pair(mine.seq, mine.shape_hash()) : std::make_pair(peer.seq, peer.hash);
    auto [it, added] = index.emplace(key, sets.size());
    if (added) sets.push_back({me ? mine.describe() : peer.what, {}});
    sets[it->second].ranks.push_back(r);
    ids[static_cast<size_t>(r)] = static_cast<int>(it->second);
  }
  // The root cause: the smallest set (ties: the one with the lowest rank, i.e. the first).
  size_t root = 0;
  for (size_t i = 1; i < sets.size(); ++i) {
    if (sets[i].ranks.size() < sets[root].ranks.size()) root = i;
  }
  std::string message = str_cat("the ranks of group '", config_.group_name,
                                "' are in different collectives: ", sets[root].what,
                                " was called on ", describe_rank_set(sets[root].ranks), " only");
  for (size_t i = 0; i < sets.size(); ++i) {
    if (i == root) continue;
    message += str_cat("; ", describe_rank_set(sets[i].ranks),
                       sets[i].ranks.size() == 1 ? " is in " : " are in ", sets[i].what);
  }
  if (!left.empty()) {
    message += str_cat("; ", describe_rank_set(left), left.size() == 1 ? " has" : " have",
                       " left the group (ProcessGroup::shutdown)");
  }
  if (!silent.empty()) {
    message += str_cat("; ", describe_rank_set(silent), silent.size() == 1 ? " is" : " are",
                       " in no collective of this group (computing, or waiting elsewhere)");
  }
  message += str_cat(". Every rank must call the same collectives in the same order (found after ",
                     "waiting ", config_.threshold.count(), " ms: HSGD_MISMATCH_CHECK_MS)");
  std::string out;
  for (size_t r = 0; r < ids.size(); ++r) out += str_cat(r ? "," : "", ids[r]);
  return out + "\n" + message;
}

}  // namespace hsgd::detail
