#pragma once
// TcpStore: the Store client of RendezvousServer / hsgd-rendezvous.
//
// Contract:
// - Every connection is TLS 1.3 keyed by options.token (comm/tls/tls.h; the token itself is
//   never sent), or plain TCP when options.insecure. The constructor throws
//   hsgd::InvalidArgument without a token (unless insecure).
// - The constructor connects with exponential backoff and jitter until connect_timeout passes,
//   then performs the handshakes (TLS, then Hello). It throws hsgd::Timeout when the server
//   never answered, and hsgd::CommError when the server refused a handshake (wrong token, a
//   server started insecure, version) - both naming host:port.
// - Every operation has a deadline: blocking operations (get, wait, multi_get) are timed by the
//   server, which answers TIMEOUT at the deadline, and the client gives up a few seconds later
//   if the server went silent (hsgd::Timeout); the others are bounded by options.timeout.
//   Nothing blocks forever.
// - Losing the server (connection refused, reset or closed: the server was killed or
//   restarted) starts an outage: the client reconnects with backoff (0.1 s doubling to 2 s,
//   with jitter) for at most reconnect_timeout from the moment it lost the server. Operations
//   meanwhile wait for it (get, wait and multi_get no longer than their own timeout, then
//   hsgd::Timeout), or throw ServerUnavailable at once inside a NoServerWait scope
//   (comm/store/store_outage.h). Past the bound they throw hsgd::CommError saying since when
//   the server at host:port is unreachable, what was tried and what to do.
// - An operation whose connection was lost is sent again once the server is back, except add()
//   when it may have been applied: it is sent again only when the server it reaches is a new
//   one (restarted: it never saw the first), else hsgd::CommError says it may or may not have
//   been applied. A compare_set sent again that finds its own desired value reports swapped;
//   a delete_key sent again may report that the key did not exist.
// - Re-publishing: the client keeps what it wrote (the last value of each key it set or won
//   with compare_set, and the sum of its add() deltas per key, minus deleted keys). When it
//   reaches a server that is a new instance (the handshake says so), it writes all of it there
//   before any other operation of this client proceeds: counters by adding its own deltas, so
//   that the sum over a job's clients is rebuilt; a key it won with compare_set only if no
//   other client wrote it there first. A key this client wrote and another client
//   deleted comes back then (nothing tells it of the delete). Once it wrote anything, a
//   background thread looks at its idle connections every 250 ms, so that a client which is
//   not using the store (a worker training) re-publishes within moments of the server coming
//   back too. Tokens are not re-published: a restarted server is given them again (its token
//   file). TcpStoreOptions::republish = false turns this off.
// - Errors name host:port, the operation and the keys. Keys longer than the server's limit, or
//   frames larger than its limit, are rejected locally with hsgd::InvalidArgument.
// - Thread-safe. Concurrent operations from several threads use separate connections from a
//   small pool (opened on demand), so a get() blocking in one thread never delays a set() from
//   another thread of the same store.
//
// Usage:
//   const std::string token = "s3cret";  // the job's token (HSGD_RDZV_TOKEN, a token file)
//   hsgd::comm::TcpStore store(
//       {.host = "127.0.0.1", .port = 29400, .job_id = "job-7", .token = token});
//   store.set("rank0", hsgd::comm::to_bytes("10.0.0.1:4000"));
//   auto peer = store.get("rank1", std::chrono::seconds(30));

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/store/store.h"
#include "comm/store/store_outage.h"

namespace hsgd::comm {

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  int port = 29400;
  std::string job_id = "default";  // key namespace on the server
  // The job's token (or the server-wide one): it keys the TLS handshake under the identity
  // psk_identity("store", job_id, name) and never crosses the wire. Required unless insecure.
  std::string token = {};
  // Who this client is, in its TLS identity (a node, a rank); empty: its random owner id.
  std::string name = {};
  // Plain TCP, no token, to a server started insecure.
  bool insecure = false;
  Duration connect_timeout = std::chrono::seconds(60);
  Duration timeout = kDefaultTimeout;  // deadline of the non-blocking operations
  // How long after losing the server the client keeps trying to reach it again (see above);
  // unset: connect_timeout.
  std::optional<Duration> reconnect_timeout = std::nullopt;
  // How messages name that setting (hsgd-run: "--rdzv-timeout").
  std::string reconnect_timeout_name = "TcpStoreOptions::reconnect_timeout";
  // Keep what this client writes and re-publish it to a restarted server (see above). Off: no
  // journal and no background thread (a load generator with thousands of clients).
  bool republish = true;
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
  // The server deletes the key once none of this client's connections has been open for
  // linger. After a lost connection to the same server the client sets its owned keys again
  // when it reconnects; a restarted server gets them with the rest of the journal (owned).
  void set_owned(const std::string& key, const Bytes& value, Duration linger) override;

  // Round trip to the server; returns true when it answered within options.timeout, false on
  // any failure (never throws for a dead server, and never waits for one: at most one
  // connection attempt of a second).
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
