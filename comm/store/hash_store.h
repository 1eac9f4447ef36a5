#pragma once
// HashStore: an in-memory Store. Several ranks living in one process (threads) share one
// instance; it is also what init_process_group uses for a world of one.
//
// Usage:
//   auto store = std::make_shared<hsgd::comm::HashStore>();
//   store->set("k", hsgd::comm::to_bytes("v"));
//   auto v = store->get("k", std::chrono::seconds(1));

#include <condition_variable>
#include <map>
#include <mutex>

#include "comm/store/store.h"

namespace hsgd::comm {

namespace detail {
// Helpers shared by the stores in this folder (HashStore, FileStore). Counters are stored as
// decimal ASCII, like torch's stores, so a counter can also be read with get().
Bytes format_counter(int64_t value);
int64_t parse_counter(const std::string& key, const Bytes& value);  // InvalidArgument if not one
std::string join_keys(const std::vector<std::string>& keys);        // "['a', 'b']"
}  // namespace detail

class HashStore : public Store {
 public:
  HashStore() = default;
  HashStore(const HashStore&) = delete;
  HashStore& operator=(const HashStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Duration timeout = kDefaultTimeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  CompareSetResult compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout = kDefaultTimeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

 private:
  // Waits (lock held) until every key exists; throws hsgd::Timeout naming the missing ones.
  void wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                   Duration timeout, const char* op);

  std::mutex mu_;
  std::condition_variable changed_;      // notified on every insertion
  std::map<std::string, Bytes> values_;  // guarded by mu_
};

}  // namespace hsgd::comm
