#pragma once
// RendezvousSession: the protocol of one rendezvous connection without its socket. The first
// frame must be a Hello (magic, version, job id, owner) naming the job the connection's TLS
// identity proved (set_proven_job; nothing is proven on an insecure server); every later frame is a
// Request, dispatched to the RendezvousState in the job's namespace. The server's Connection feeds
// it the frames its FrameDecoder assembled and does the I/O and the logging; the fuzz target and
// its replay test (tests/comm/rendezvous/fuzz/) feed it bytes directly. Internal to the server.
//
// Contract: on_frame() never throws on any input; after a step that is not kContinue the
// session must not be fed again (the connection closes). Not thread-safe (one connection's
// strand).

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "comm/rendezvous/detail/asio.h"
#include "comm/rendezvous/detail/rendezvous_state.h"
#include "comm/rendezvous/proto/rendezvous.pb.h"
#include "comm/rendezvous/rendezvous_server.h"
#include "comm/rendezvous/rendezvous_server_tokens.h"

namespace hsgd::comm {

// Reads the fields of a get/wait/multi_get frame without parsing its keys: id, op, timeout_ms and
// the bytes of its keys fields (RendezvousState::handle_known_keys). Returns std::nullopt unless
// the frame holds only those fields, at least one key, and its keys fields one after the other
// (as protobuf writes them); such a frame is parsed whole instead.
std::optional<RendezvousState::BlockingRequest> scan_blocking_request(std::string_view body);

class RendezvousSession {
 public:
  struct Step {
    enum class Kind {
      kContinue,   // keep reading
      kRefused,    // the handshake was refused: write hello_reply, then close
      kMalformed,  // a request frame did not parse: close
    };
    Kind kind = Kind::kContinue;
    std::optional<proto::HelloReply> hello_reply;     // the handshake's answer
    std::optional<RendezvousAnswer> answer;           // a request answered now
    std::shared_ptr<RendezvousState::Waiter> waiter;  // a request answered later, by reply
  };

  // options must outlive the session; async_reply receives the answers of waiters
  // (from any thread, under the state's mutex: it must only queue work). Deadline timers run
  // on executor.
  RendezvousSession(const RendezvousServerOptions& options, RendezvousState& state,
                    asio::any_io_executor executor, RendezvousState::Reply async_reply);

  // The job the TLS handshake proved the client holds the key of; the Hello must name it.
  // Unless options.insecure, a Hello before this is refused.
  void set_proven_job(std::string job) { proven_job_ = std::move(job); }

  Step on_frame(std::string_view body);

  // The connection closed: the owner it attached (if any) is detached from the state. Call once.
  void on_close();

  bool handshake_done() const { return handshake_done_; }
  // The job id, once the handshake is done ("" before).
  const std::string& job() const { return job_; }
  // The job id the last Hello claimed (for logging a refusal; may be anything).
  const std::string& claimed_job() const { return claimed_job_; }

  // A refusal before any Hello was parsed (a frame over the handshake limit, the byte budget).
  static proto::HelloReply refusal(const std::string& reason);

 private:
  Step on_hello(std::string_view body);

  const RendezvousServerOptions& options_;
  RendezvousState& state_;
  asio::any_io_executor executor_;
  RendezvousState::Reply async_reply_;
  bool handshake_done_ = false;
  std::string job_;
  std::string owner_;  // the Hello's owner, once the handshake is done
  std::string claimed_job_;
  std::string proven_job_;
};

}  // namespace hsgd::comm
