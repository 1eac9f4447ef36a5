#pragma once
// Internals of RendezvousServer (comm/rendezvous/rendezvous_server.h), shared by
// rendezvous_server.cpp (the listener, the connection table, job bookkeeping) and
// rendezvous_server_connection.cpp (one client connection). Not a public header.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/rendezvous/detail/asio.h"
#include "comm/rendezvous/detail/rendezvous_server_session.h"
#include "comm/rendezvous/detail/rendezvous_state.h"
#include "comm/rendezvous/frame.h"
#include "comm/rendezvous/proto/rendezvous.pb.h"
#include "comm/rendezvous/rendezvous_server.h"
#include "comm/rendezvous/rendezvous_server_tokens.h"
#include "comm/tls/tls.h"

namespace hsgd::comm {

// Lets one message of a kind through per interval and counts those held back, so that a client
// repeating a mistake (or an attacker) cannot flood the log. Thread-safe.
class LogThrottle {
 public:
  explicit LogThrottle(std::chrono::milliseconds interval) : interval_(interval) {}
  // When this message may be logged: how many were held back since the last one; else nullopt.
  std::optional<uint64_t> allow();

 private:
  const std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point next_{};  // guarded by mu_
  uint64_t held_back_ = 0;                        // guarded by mu_
};

// " (N more like it in the last 10 s)" or "".
std::string held_back_note(uint64_t held_back);

class RendezvousServer::Impl {
 public:
  class Connection;

  static constexpr int kAcceptBatch = 64;

  explicit Impl(RendezvousServerOptions options);
  ~Impl();

  void start();
  void stop();
  // Starts one async_accept unless the connection limit is reached; runs on accept_strand_.
  // Its handler accepts up to kAcceptBatch connections waiting in the backlog.
  void accept();
  // False (and accepting paused until remove() resumes it) at the connection limit.
  bool room_to_accept();
  // Registers and starts a new connection.
  void adopt(asio::ip::tcp::socket socket);
  void on_accept_error(const boost::system::error_code& ec);
  // The connection closed; job is its job id, or nullptr before a handshake.
  void remove(const Connection* connection, const std::string* job);
  // A connection completed its handshake for job.
  void joined(const std::string& job, const std::string& peer);

  // The budget of bytes held by connections still in their handshake: reserve before reading,
  // release when the bytes are dropped. reserve() returns false (and reserves nothing) when n
  // more bytes would exceed options_.max_unauthenticated_bytes.
  bool reserve_unauthenticated(size_t n);
  void release_unauthenticated(size_t n) { unauthenticated_bytes_.fetch_sub(n); }

  // Constant after construction (port_, max_connections_ after start()).
  const RendezvousServerOptions options_;
  const TokenTable tokens_;
  // The TLS contexts (null when insecure). Declared before io_: the connections' SSL objects,
  // destroyed with io_'s handlers, refer to them.
  std::shared_ptr<tls::Context> tls_;
  std::unique_ptr<asio::ssl::context> ssl_context_;
  asio::io_context io_;  // declared first among the Asio objects: destroyed last
  RendezvousState state_;
  asio::ip::tcp::acceptor acceptor_;
  asio::strand<asio::io_context::executor_type> accept_strand_;
  asio::steady_timer accept_backoff_;  // used on accept_strand_ only
  std::chrono::milliseconds backoff_{0};
  std::vector<std::thread> threads_;
  int port_ = 0;
  size_t max_connections_ = 0;
  bool started_ = false;
  std::atomic<bool> stopped_ = false;
  std::atomic<size_t> unauthenticated_bytes_ = 0;

  // Log throttles, one per kind of message.
  LogThrottle accept_log_{std::chrono::seconds(10)};
  LogThrottle refusal_log_{std::chrono::seconds(10)};
  LogThrottle tls_log_{std::chrono::seconds(10)};
  LogThrottle request_log_{std::chrono::seconds(10)};

  mutable std::mutex mu_;
  // Guarded by mu_: every open connection, for stop() and num_connections().
  std::unordered_map<const Connection*, std::weak_ptr<Connection>> connections_;
  // Guarded by mu_: accept() found the connection limit reached; remove() resumes it.
  bool accept_paused_ = false;
  // Guarded by mu_: connected clients per job, to log when a job comes and goes.
  std::unordered_map<std::string, size_t> job_clients_;
  // Guarded by mu_: jobs without clients whose keys expire (options_.idle_job_ttl > 0).
  std::unordered_map<std::string, std::shared_ptr<asio::steady_timer>> expiries_;
};

// One client connection. All its handlers run on its strand; replies of waiters woken from
// other connections are posted to that strand.
//
// Reading: it waits until the socket is readable, then reads what the kernel holds (ioctl
// FIONREAD) into the FrameDecoder, frame by frame, at most kReadBudget bytes per turn (then it
// yields, so one busy client cannot starve the others on its thread). It never asks the
// decoder for more than has arrived.
class RendezvousServer::Impl::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Impl& server, asio::ip::tcp::socket socket);

  void start();
  asio::any_io_executor executor() { return socket_.get_executor(); }
  // Queue a frame; safe from any thread. An answer's shared part is written from the buffer it
  // shares with the other waiters' answers, never copied.
  void send(const google::protobuf::MessageLite& message);
  void send(const RendezvousAnswer& answer);
  // Closes the socket and drops pending waits; runs on the strand or after the I/O threads
  // stopped.
  void close(const char* why);

 private:
  static constexpr size_t kReadBudget = 256 << 10;
  static constexpr size_t kTlsReadChunk = 16 << 10;  // one TLS record

  // Plain TCP (insecure server): waits until readable, reads what the kernel holds.
  void wait_readable();
  void on_readable();
  // TLS: peeks at the first byte (a plain client gets a plain refusal), runs the handshake,
  // then reads decrypted bytes, at most kTlsReadChunk per turn.
  void wait_first_byte();
  void start_tls();
  // Certificate mode: reads the client's identity claim, checks it, answers with the server's
  // proof (tls.h), then goes on as after a PSK handshake.
  void read_identity_claim();
  void refuse_identity(const std::string& why);
  // The TLS identity is proven: its job is the only one this connection may name.
  void on_tls_identity();
  void read_tls();
  // Feeds the decoder's state after got bytes were committed; false once reading must stop.
  bool on_bytes();
  void on_oversized();
  // Returns false when the connection was closed (or will be, after a refusal is written).
  bool on_frame();
  // Refuses the handshake (logged, throttled) and closes once the reply is written.
  void refuse(const std::string& job, const proto::HelloReply& reply);
  void release_unauthenticated();
  // A frame to write: head, then the shared tail (if any).
  struct OutFrame {
    std::string head;
    std::shared_ptr<const std::string> tail;
    size_t size() const { return head.size() + (tail ? tail->size() : 0); }
  };
  void post_write(OutFrame frame);
  void queue_write(OutFrame frame);
  void write_next();

  Impl& server_;
  asio::ip::tcp::socket socket_;
  tls::ConnectionKeys keys_;  // the identity the TLS handshake proved
  std::unique_ptr<asio::ssl::stream<asio::ip::tcp::socket&>> tls_;
  bool tls_up_ = false;  // the TLS handshake succeeded: every byte goes through tls_
  std::vector<uint8_t> claim_;  // certificate mode: the client's identity claim
  tls::Answer answer_{};        // certificate mode: the server's answer, while it is written
  asio::steady_timer hello_timer_{socket_.get_executor()};
  std::string peer_;
  // Touched only on the strand.
  FrameDecoder decoder_;
  std::optional<RendezvousSession> session_;  // created by start()
  size_t unauthenticated_held_ = 0;           // bytes reserved from the server's pre-login budget
  bool handshake_done_ = false;
  bool close_after_write_ = false;
  bool closed_ = false;
  std::string job_;
  std::deque<OutFrame> writes_;
  size_t queued_bytes_ = 0;
  std::vector<std::weak_ptr<RendezvousState::Waiter>> waiters_;
  size_t live_waiters_hint_ = 0;
};

}  // namespace hsgd::comm
