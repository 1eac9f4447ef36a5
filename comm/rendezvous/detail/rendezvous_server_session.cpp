#include "comm/rendezvous/detail/rendezvous_server_session.h"

#include <utility>

#include "comm/rendezvous/frame.h"

namespace hsgd::comm {

namespace {

// A client names itself with a few random bytes; more is not an owner but a waste of memory.
constexpr size_t kMaxOwnerBytes = 128;

}  // namespace

RendezvousSession::RendezvousSession(const RendezvousServerOptions& options,
                                     const TokenTable& tokens, RendezvousState& state,
                                     asio::any_io_executor executor,
                                     RendezvousState::Reply async_reply)
    : options_(options),
      tokens_(tokens),
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
  proto::Request request;
  if (!request.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    step.kind = Step::Kind::kMalformed;
    return step;
  }
  auto outcome = state_.handle(job_, request, executor_, async_reply_, owner_);
  step.response = std::move(outcome.response);
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
  } else if (!tokens_.admits(hello.job_id(), hello.token())) {
    refusal = hello.token().empty() ? "this server requires a token and none was given"
                                    : "invalid token for job '" + hello.job_id() + "'";
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
