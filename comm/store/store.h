#pragma once
// Store: the key-value service that processes of one job meet through (like torch's Store).
//
// Implementations: TcpStore (client of hsgd-rendezvous), FileStore (shared file system),
// HashStore (in-memory, for tests; several ranks in one process share one instance) and
// PrefixStore (namespaces another store). as_gloo_store() adapts any Store for Gloo's
// rendezvous.
//
// Contract, for every implementation:
// - Every blocking call takes a timeout; when it passes, hsgd::Timeout is thrown naming the
//   operation, the keys and (for remote stores) host:port. Nothing blocks forever.
// - get() blocks until the key exists. add() creates the counter at 0 if it is missing.
// - Thread-safe: one Store may be used from several threads.
//
// Usage:
//   auto store = std::make_shared<hsgd::comm::HashStore>();
//   store->set("a", hsgd::comm::to_bytes("hello"));
//   std::string v = hsgd::comm::to_string(store->get("a", std::chrono::seconds(5)));

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace hsgd::comm {

using Bytes = std::vector<uint8_t>;
using Duration = std::chrono::milliseconds;

inline constexpr Duration kDefaultTimeout = std::chrono::seconds(300);

inline Bytes to_bytes(std::string_view s) { return Bytes(s.begin(), s.end()); }
inline std::string to_string(const Bytes& b) { return std::string(b.begin(), b.end()); }

// Result of compare_set: whether the swap happened, and the value now stored.
struct CompareSetResult {
  bool swapped = false;
  Bytes current;
};

class Store {
 public:
  virtual ~Store() = default;

  // Stores value under key, replacing any previous value, and wakes waiters on that key.
  virtual void set(const std::string& key, const Bytes& value) = 0;

  // Returns the value of key, blocking until it exists or timeout passes (then hsgd::Timeout).
  virtual Bytes get(const std::string& key, Duration timeout = kDefaultTimeout) = 0;

  // Atomically adds delta to the 64-bit counter under key (missing = 0); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // Sets key to desired if its current value equals expected (a missing key matches an empty
  // expected). Returns whether it swapped and the value stored afterwards.
  virtual CompareSetResult compare_set(const std::string& key, const Bytes& expected,
                                       const Bytes& desired) = 0;

  // Blocks until every key exists, or throws hsgd::Timeout naming the keys still missing.
  virtual void wait(const std::vector<std::string>& keys, Duration timeout = kDefaultTimeout) = 0;

  // Returns true when every key exists; never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  // Removes key; returns whether it existed.
  virtual bool delete_key(const std::string& key) = 0;

  // Number of keys in this store (in this job / prefix).
  virtual int64_t num_keys() = 0;

  // Batched forms. The defaults call the single-key operations; remote stores override them
  // to use one round trip.
  virtual std::vector<Bytes> multi_get(const std::vector<std::string>& keys,
                                       Duration timeout = kDefaultTimeout);
  virtual void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values);

  // Like set(), but the key lives only as long as this client: TcpStore's server deletes it
  // once none of the client's connections has been open for `linger` (its process died, or it
  // lost the server for that long); any other write or a delete of the key makes it an
  // ordinary key again. Stores without a server keep it like set() (the default).
  virtual void set_owned(const std::string& key, const Bytes& value, Duration linger);
};

}  // namespace hsgd::comm
