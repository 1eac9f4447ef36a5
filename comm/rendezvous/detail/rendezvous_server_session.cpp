#include "comm/rendezvous/detail/rendezvous_server_session.h"

#include <google/protobuf/arena.h>
#include <google/protobuf/io/coded_stream.h>

#include <memory>
#include <utility>

#include "comm/rendezvous/frame.h"

namespace hsgd::comm {

namespace {

// A client names itself with a few random bytes; more is not an owner but a waste of memory.
constexpr size_t kMaxOwnerBytes = 128;
// The arena a request is parsed on starts in a block of this size that each thread reuses for
// every request it parses: a multi_get naming 16,384 keys fits (about 1 MiB of strings and
// pointers); larger requests continue in blocks of kArenaBlockBytes.
constexpr size_t kScratchBytes = 2 << 20;
constexpr size_t kArenaBlockBytes = 256 << 10;

// This thread's scratch block. A thread parses one request at a time, and the arena using the
// block is destroyed before on_frame() returns, so no two arenas ever share it.
char* parse_scratch() {
  thread_local const std::unique_ptr<char[]> block(new char[kScratchBytes]);
  return block.get();
}

}  // namespace

std::optional<RendezvousState::BlockingRequest> scan_blocking_request(std::string_view body) {
  // Tags of the fields read (field number << 3 | wire type): varints, and the keys.
  constexpr uint32_t kIdTag = (1 << 3) | 0;
  constexpr uint32_t kOpTag = (2 << 3) | 0;
  constexpr uint32_t kKeysTag = (3 << 3) | 2;
  constexpr uint32_t kTimeoutTag = (6 << 3) | 0;
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(body.data()),
                                            static_cast<int>(body.size()));
  RendezvousState::BlockingRequest request;
  uint64_t op = 0;
  int keys_begin = -1;
  int keys_end = -1;
  for (;;) {
    const int at = in.CurrentPosition();
    const uint32_t tag = in.ReadTag();
    if (tag == 0) {
      if (at != static_cast<int>(body.size())) return std::nullopt;  // malformed: parse it
      break;
    }
    uint64_t value = 0;
    uint32_t length = 0;
    switch (tag) {
      case kKeysTag:
        if (keys_end >= 0 && keys_end != at) return std::nullopt;  // another field in between
        if (!in.ReadVarint32(&length) || !in.Skip(static_cast<int>(length))) return std::nullopt;
        if (keys_begin < 0) keys_begin = at;
        keys_end = in.CurrentPosition();
        break;
      case kIdTag:
      case kOpTag:
      case kTimeoutTag:
        if (!in.ReadVarint64(&value)) return std::nullopt;
        if (tag == kIdTag) request.id = value;
        if (tag == kOpTag) op = value;
        if (tag == kTimeoutTag) request.timeout_ms = static_cast<int64_t>(value);
        break;
      default:
        return std::nullopt;
    }
  }
  if (op != proto::OP_GET && op != proto::OP_WAIT && op != proto::OP_MULTI_GET) return std::nullopt;
  if (keys_begin < 0) return std::nullopt;
  request.op = static_cast<proto::Op>(op);
  request.keys_wire =
      body.substr(static_cast<size_t>(keys_begin), static_cast<size_t>(keys_end - keys_begin));
  return request;
}

RendezvousSession::RendezvousSession(const RendezvousServerOptions& options, RendezvousState& state,
                                     asio::any_io_executor executor,
                                     RendezvousState::Reply async_reply)
    : options_(options),
      state_(state),
      executor_(std::move(executor)),
      async_reply_(std::move(async_reply)) {}

proto::HelloReply RendezvousSession::refusal(const std::string& reason) {
  proto::HelloReply reply;
  reply.set_version(kProtocolVersion);
  reply.set_accepted(false);
  reply.set_error(reason);
  return reply;
}

RendezvousSession::Step RendezvousSession::on_frame(std::string_view body) {
  if (body.empty()) body = std::string_view("", 0);  // a valid pointer for protobuf
  if (!handshake_done_) return on_hello(body);
  Step step;
  // The waits of one rendezvous name the same keys: only the first one's are parsed.
  if (auto blocking = scan_blocking_request(body)) {
    if (auto outcome = state_.handle_known_keys(job_, *blocking, executor_, async_reply_)) {
      step.answer = std::move(outcome->answer);
      step.waiter = std::move(outcome->waiter);
      return step;
    }
  }
  // A multi_get of a whole job names every rank's key: on an arena in reused memory its strings
  // cost no allocation each (malloc and free of them, and the heap trimming that follows, cost
  // more than the parse itself).
  google::protobuf::ArenaOptions arena_options;
  arena_options.initial_block = parse_scratch();
  arena_options.initial_block_size = kScratchBytes;
  arena_options.start_block_size = kArenaBlockBytes;
  arena_options.max_block_size = kArenaBlockBytes;
  google::protobuf::Arena arena(arena_options);
  auto* request = google::protobuf::Arena::CreateMessage<proto::Request>(&arena);
  if (!request->ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    step.kind = Step::Kind::kMalformed;
    return step;
  }
  auto outcome = state_.handle(job_, *request, executor_, async_reply_, owner_);
  step.answer = std::move(outcome.answer);
  step.waiter = std::move(outcome.waiter);
  return step;
}

void RendezvousSession::on_close() {
  if (handshake_done_) state_.detach(job_, owner_, executor_);
}

RendezvousSession::Step RendezvousSession::on_hello(std::string_view body) {
  Step step;
  proto::Hello hello;
  std::string refusal;
  if (!hello.ParseFromArray(body.data(), static_cast<int>(body.size())) ||
      hello.magic() != kProtocolMagic) {
    refusal = "not an hsgd rendezvous handshake (bad magic)";
  } else if (hello.version() != kProtocolVersion) {
    refusal = "protocol version " + std::to_string(hello.version()) +
              " is not supported; this server speaks version " + std::to_string(kProtocolVersion);
  } else if (auto problem = job_id_problem(hello.job_id())) {
    refusal = *problem;
  } else if (hello.owner().size() > kMaxOwnerBytes) {
    refusal = "the owner named in the handshake has " + std::to_string(hello.owner().size()) +
              " bytes; at most " + std::to_string(kMaxOwnerBytes) + " are allowed";
  } else if (!options_.insecure && proven_job_.empty()) {
    refusal = "this server accepts only TLS connections keyed by the job's token";
  } else if (!options_.insecure && hello.job_id() != proven_job_) {
    refusal = "this connection proved the token of job '" + printable_excerpt(proven_job_) +
              "', not of job '" + printable_excerpt(hello.job_id()) + "'";
  }
  claimed_job_ = hello.job_id();
  if (!refusal.empty()) {
    step.kind = Step::Kind::kRefused;
    step.hello_reply = RendezvousSession::refusal(refusal);
    return step;
  }
  handshake_done_ = true;
  job_ = hello.job_id();
  owner_ = hello.owner();
  state_.attach(job_, owner_);
  proto::HelloReply reply;
  reply.set_version(kProtocolVersion);
  reply.set_accepted(true);
  reply.set_max_frame_bytes(options_.max_frame_bytes);
  reply.set_max_key_bytes(options_.max_key_bytes);
  reply.set_max_keys_per_request(options_.max_keys_per_request);
  reply.set_instance(state_.instance());
  step.hello_reply = std::move(reply);
  return step;
}

}  // namespace hsgd::comm
