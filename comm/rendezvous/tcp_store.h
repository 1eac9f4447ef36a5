#pragma once
// TcpStore: the Store client of RendezvousServer / hsgd-rendezvous.
//
// Contract:
// - The constructor connects with exponential backoff and jitter until connect_timeout passes,
//   then performs the handshake. It throws hsgd::Timeout when the server never answered, and
//   hsgd::CommError when the server refused the handshake (wrong token, version) - both naming
//   host:port.
// - Every operation has a deadline: blocking operations (get, wait, multi_get) are timed by the
//   server, which answers TIMEOUT at the deadline, and the client gives up a few seconds later
//   if the server went silent; the others are bounded by options.timeout. Nothing blocks
//   forever.
// - After an I/O failure or a client-side deadline that connection is closed and the next
//   operation reconnects (within connect_timeout); the failed operation is not retried, since
//   add() is not idempotent.
// - Errors name host:port, the operation and the keys. Keys longer than the server's limit, or
//   frames larger than its limit, are rejected locally with hsgd::InvalidArgument.
// - Thread-safe. Concurrent operations from several threads use separate connections from a
//   small pool (opened on demand), so a get() blocking in one thread never delays a set() from
//   another thread of the same store.
//
// Usage:
//   hsgd::comm::TcpStore store({.host = "127.0.0.1", .port = 29400, .job_id = "job-7"});
//   store.set("rank0", hsgd::comm::to_bytes("10.0.0.1:4000"));
//   auto peer = store.get("rank1", std::chrono::seconds(30));

#include <memory>
#include <string>
#include <vector>

#include "comm/store/store.h"

namespace hsgd::comm {

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  int port = 29400;
  std::string job_id = "default";  // key namespace on the server
  std::string token = {};          // must match the server's token, if it has one
  Duration connect_timeout = std::chrono::seconds(60);
  Duration timeout = kDefaultTimeout;  // deadline of the non-blocking operations
};

class TcpStore : public Store {
 public:
  explicit TcpStore(TcpStoreOptions options);
  ~TcpStore() override;

  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Duration timeout = kDefaultTimeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  CompareSetResult compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout = kDefaultTimeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  // One round trip each.
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys,
                               Duration timeout = kDefaultTimeout) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;

  // Round trip to the server; returns true when it answered within options.timeout, false on
  // any failure (never throws for a dead server; a reconnect gets at most
  // min(connect_timeout, timeout)).
  bool ping();

  // "host:port" as used in error messages.
  const std::string& endpoint() const;
  // The protocol version the server announced in the handshake.
  uint32_t server_version() const;

 private:
  class Client;
  std::unique_ptr<Client> client_;
};

}  // namespace hsgd::comm
