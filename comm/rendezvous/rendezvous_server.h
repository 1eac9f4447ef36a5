#pragma once
// RendezvousServer: the key-value server processes of a job meet through (hsgd-rendezvous,
// embedded by `hsgd-run --standalone`). TcpStore is its client.
//
// Contract:
// - Asynchronous (Boost.Asio) on `threads` threads it owns; one thread serves thousands of
//   connections. Speaks the protocol of comm/rendezvous/proto/rendezvous.proto over TCP (IPv4 or
//   IPv6, TCP_NODELAY, listen backlog = /proc/sys/net/core/somaxconn: the kernel drops the SYNs of
//   clients beyond it, which retry after 1 s, so a host serving more ranks at once should raise
//   it). Each turn of the event loop accepts up to 64 waiting connections.
// - Every connection is TLS 1.3 with a pre-shared key (comm/tls/tls.h): the client presents the
//   identity psk_identity("store", job, who) and proves it holds derive_psk(token, identity),
//   where token is the job's own (job_tokens, read from a token file by
//   comm/rendezvous/rendezvous_server_tokens.h) or else the server-wide one (token). The token
//   never crosses the wire. A connection that fails the TLS handshake (random bytes, a wrong
//   token, a job without a token, a plain client, or no handshake within handshake_timeout) is
//   closed having touched no job, and logged at warn level naming the peer's address only.
//   A client speaking the plain protocol gets a plain refusal saying that TLS is required.
// - Then the client's first frame is a Hello naming its job id (1 to 256 printable ASCII bytes
//   without spaces); keys are namespaced by job id, so two jobs never see each other's keys. The
//   Hello must name the job the TLS identity proved: a client holding job A's token cannot open
//   job B; the server-wide token opens the jobs without a token of their own.
// - insecure = true: plain TCP, no token, nobody authenticated (anyone reaching the port reads
//   and writes every job). Only for a trusted single host, chosen explicitly.
// - Nothing a client does grows the server without bound:
//   - before the handshake a frame may have at most max_handshake_bytes, and all connections
//     still in their handshake together hold at most max_unauthenticated_bytes (beyond that new
//     handshakes are refused); they are closed after handshake_timeout;
//   - a frame's buffer grows with the bytes that arrived, never to the length its header claims;
//   - at most max_connections connections are open; at the limit the server stops accepting
//     (new clients wait in the listen backlog) until one closes. Out of file descriptors
//     (EMFILE/ENFILE) it backs off (up to 1 s) instead of retrying at once;
//   - per-job quotas on keys, bytes and pending waits, and a limit on the number of jobs (see
//     comm/rendezvous/detail/rendezvous_state.h); a request breaking one gets INVALID_ARGUMENT
//     naming the limit;
//   - wait timeouts are clamped to one year.
// - get/wait/multi_get are push-based: a waiter is registered on its missing keys and woken by
//   set/add/compare_set/multi_set; a timer answers TIMEOUT at the deadline. Nothing polls. Waits
//   of one job naming the same keys in the same order (every rank reading every rank's address)
//   share their registration and their answer: the values are encoded once and every reply
//   carries that one buffer, and the keys of such a request are not parsed again (see
//   comm/rendezvous/detail/rendezvous_state.h).
// - A client that disconnects has its pending waits dropped. An oversized or malformed frame
//   closes that connection only; a request that breaks a key limit gets an INVALID_ARGUMENT
//   answer and the connection stays open.
// - Refusals and errors are logged through comm::logger() at warn/error level, each kind at most
//   once per 10 s with a count of those held back (a client repeating a mistake, or an attacker,
//   cannot flood the log); client-supplied text is logged as a short printable excerpt. The first
//   and last client of each job at info level; every connection at debug level (so that a
//   1,000-rank job does not flood stderr at the default level).
// - A job's keys survive its clients disconnecting (a restarted worker finds them again). With
//   idle_job_ttl > 0 they are deleted once the job has had no client for that long (a
//   long-lived shared server does not grow forever); a client of the job arriving in time
//   keeps them.
//
// Usage:
//   const std::string token = "s3cret";  // e.g. read_token_file(path).token_for(job)
//   hsgd::comm::RendezvousServer server({.host = "127.0.0.1", .port = 0, .token = token});
//   server.start();                      // bound and listening when it returns
//   hsgd::comm::TcpStore store({.port = server.port(), .job_id = "job-1", .token = token});

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <string>

namespace hsgd::comm {

// How refusals and log lines name the server's limits: the RendezvousServerOptions fields by
// default; hsgd-rendezvous passes its flags ("--max-jobs"), so that its users read the setting
// they can change.
struct RendezvousLimitNames {
  std::string max_keys_per_job = "max_keys_per_job";
  std::string max_job_bytes = "max_job_bytes";
  std::string max_waits_per_job = "max_waits_per_job";
  std::string max_jobs = "max_jobs";
  std::string max_connections = "max_connections";
};

struct RendezvousServerOptions {
  std::string host = "127.0.0.1";  // address to bind: "127.0.0.1", "::1", "0.0.0.0", a name
  int port = 29400;                // 0 = let the kernel pick a free port (see port())
  // The server-wide token, for the jobs without their own; empty = none. Unless insecure, it or job_tokens
  // must hold a token (the constructor throws hsgd::InvalidArgument otherwise).
  std::string token = {};
  // Tokens of single jobs (job id -> token): a client of that job may key its TLS with its own.
  std::map<std::string, std::string> job_tokens = {};
  // Plain TCP without authentication; then token and job_tokens must be empty (a token would
  // promise a protection plain TCP does not give).
  bool insecure = false;
  size_t max_frame_bytes = 8 << 20;  // larger frames close the connection
  size_t max_key_bytes = 4096;
  size_t max_keys_per_request = 65536;
  // Quotas (comm/rendezvous/detail/rendezvous_state.h): keys, bytes (keys + values + keys of
  // pending waits) and pending waits of one job, and the number of jobs holding keys.
  size_t max_keys_per_job = 100000;
  size_t max_job_bytes = size_t{64} << 20;
  size_t max_waits_per_job = 10000;
  size_t max_jobs = 10000;
  // Before the handshake (a Hello is about 100 bytes): the largest frame accepted, and the bytes
  // all connections still in their handshake may hold together.
  size_t max_handshake_bytes = 4096;
  size_t max_unauthenticated_bytes = size_t{4} << 20;
  // Open connections at most; 0 = from RLIMIT_NOFILE at start(): the soft limit minus a reserve
  // of soft/8 (between 16 and 256) for the process's other descriptors.
  size_t max_connections = 0;
  RendezvousLimitNames limit_names = {};
  int threads = 1;  // I/O threads
  // A connection without a completed handshake (TLS and Hello) by then is closed (port
  // scanners, stuck clients), so that stray connections cannot pile up file descriptors.
  std::chrono::milliseconds handshake_timeout = std::chrono::seconds(60);
  // Keys of a job without clients for this long are deleted; 0 keeps them while the server
  // runs.
  std::chrono::milliseconds idle_job_ttl = std::chrono::milliseconds(0);
};

class RendezvousServer {
 public:
  // Validates the options (hsgd::InvalidArgument naming the bad value); does not bind yet.
  explicit RendezvousServer(RendezvousServerOptions options);
  // Stops the server (see stop()).
  ~RendezvousServer();

  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  // Binds, listens and starts the I/O threads; returns when connections are accepted. Throws
  // hsgd::CommError naming host:port when the address cannot be resolved or bound. Calling it
  // twice throws hsgd::InvalidArgument.
  void start();

  // The bound port (the kernel's choice when options.port was 0). Valid after start().
  int port() const;
  // The host the server was asked to bind, as given in the options.
  std::string host() const;
  // True when the server speaks plain TCP without authentication (options.insecure).
  bool insecure() const;

  // Number of jobs that hold keys (for tests and monitoring).
  size_t num_jobs() const;

  // Closes the listener and every connection, drops pending waits and joins the I/O threads.
  // Idempotent; safe to call before start().
  void stop();

  // Number of open client connections (handshake done or not). For tests and benchmarks.
  size_t num_connections() const;
  // Number of get/wait/multi_get requests waiting for keys, over all jobs. For tests.
  size_t num_pending_waits() const;
  // Bytes held by connections that have not completed their handshake. For tests.
  size_t unauthenticated_bytes() const;
  // The connection limit in force (options.max_connections, or its default). Valid after
  // start().
  size_t max_connections() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hsgd::comm
