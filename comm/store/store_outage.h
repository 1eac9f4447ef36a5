#pragma once
// What a remote store (TcpStore) reports while its server is away, and how a caller that must
// not wait for the server (hsgd-run's monitor loop, which also forwards output and signals) says
// so.
//
// While the server cannot be reached (refused, reset, closed), a TcpStore retries with backoff,
// bounded by its reconnect timeout counted from the moment it lost the server
// (comm/rendezvous/tcp_store.h). An operation
//   - waits for the server meanwhile, by default (then completes or, past the bound, throws
//     hsgd::CommError saying since when the server is unreachable, what was tried and what to
//     do);
//   - inside a NoServerWait scope on its thread, does not wait: it throws ServerUnavailable at
//     once (after at most one short connection attempt when one is due). The operation did not
//     take effect on the server; the caller asks again later. Past the bound it throws the same
//     hsgd::CommError as above.
//
// Usage:
//   try {
//     const hsgd::comm::NoServerWait no_wait;
//     bool failed = store->check({"attempt/0/failed"});
//   } catch (const hsgd::comm::ServerUnavailable& e) {
//     // e.outage().since: the server is away; keep working, ask again next round
//   }

#include <chrono>
#include <string>

#include "comm/error.h"

namespace hsgd::comm {

// An outage as the client saw it.
struct ServerOutage {
  std::string endpoint;                           // "host:port"
  std::chrono::system_clock::time_point since{};  // when the client lost the server
  std::chrono::milliseconds duration{0};          // how long it has been away so far
  std::chrono::milliseconds bound{0};             // how long the client keeps trying
  int attempts = 0;                               // connection attempts since
  std::string last_error;                         // of the last attempt
};

// The server is away and the operation did not wait for it (see above). Not thrown once the
// outage is longer than its bound: that is a plain hsgd::CommError.
class ServerUnavailable : public CommError {
 public:
  ServerUnavailable(const std::string& message, ServerOutage outage)
      : CommError(message), outage_(std::move(outage)) {}
  const ServerOutage& outage() const { return outage_; }

 private:
  ServerOutage outage_;
};

// For its lifetime, remote stores used from the constructing thread do not wait for a server
// that is away (see above). Nests; not movable.
class NoServerWait {
 public:
  NoServerWait();
  ~NoServerWait();
  NoServerWait(const NoServerWait&) = delete;
  NoServerWait& operator=(const NoServerWait&) = delete;

  // Whether the calling thread is inside such a scope.
  static bool active();
};

// For its lifetime, remote stores used from the constructing thread wait for a server that is
// away again (within their reconnect bound), inside a NoServerWait scope too: for a write that
// must not be skipped. Restores the enclosing scopes on destruction; not movable.
class ServerWait {
 public:
  ServerWait();
  ~ServerWait();
  ServerWait(const ServerWait&) = delete;
  ServerWait& operator=(const ServerWait&) = delete;

 private:
  int saved_depth_;
};

// "2026-12-04 18:40:12 UTC": a wall-clock time as messages show it.
std::string utc_text(std::chrono::system_clock::time_point t);

}  // namespace hsgd::comm
