#include "tests/comm/rendezvous/fuzz/rendezvous_fuzz_input.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <vector>

#include "comm/rendezvous/detail/asio.h"
#include "comm/rendezvous/detail/rendezvous_server_session.h"
#include "comm/rendezvous/detail/rendezvous_state.h"
#include "comm/rendezvous/frame.h"
#include "comm/rendezvous/rendezvous_server.h"
#include "comm/rendezvous/rendezvous_server_tokens.h"

namespace hsgd::comm::fuzz {
namespace {

const RendezvousServerOptions& fuzz_options() {
  static const RendezvousServerOptions options{.token = "root",
                                               .max_frame_bytes = 64 << 10,
                                               .max_keys_per_job = 64,
                                               .max_job_bytes = 64 << 10,
                                               .max_waits_per_job = 8,
                                               .max_jobs = 4,
                                               .max_handshake_bytes = 4096};
  return options;
}

void check(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "rendezvous fuzz: invariant broken: %s\n", what);
  std::abort();
}

}  // namespace

Summary run_input(const uint8_t* data, size_t size) {
  Summary summary;
  if (size == 0) return summary;
  const auto& options = fuzz_options();
  const size_t chunk = 1 + data[0] % 64;
  std::span<const uint8_t> stream(data + 1, size - 1);

  asio::io_context io;
  RendezvousState state(RendezvousLimits{.max_key_bytes = options.max_key_bytes,
                                         .max_keys_per_request = options.max_keys_per_request,
                                         .max_keys_per_job = options.max_keys_per_job,
                                         .max_job_bytes = options.max_job_bytes,
                                         .max_waits_per_job = options.max_waits_per_job,
                                         .max_jobs = options.max_jobs});
  RendezvousSession session(options, state, io.get_executor(),
                            [&summary](const RendezvousAnswer&) { ++summary.async_replies; });
  session.set_proven_job("fuzz");  // what the connection's TLS handshake would have proved
  FrameDecoder decoder(options.max_handshake_bytes);
  std::vector<std::shared_ptr<RendezvousState::Waiter>> waiters;

  while (!stream.empty() && !summary.closed) {
    const auto piece = stream.first(std::min(chunk, stream.size()));
    const size_t taken = decoder.feed(piece);
    stream = stream.subspan(taken);
    if (decoder.state() == FrameDecoder::State::kOversized) {
      summary.closed = true;
    } else if (decoder.state() == FrameDecoder::State::kFrame) {
      ++summary.frames;
      auto step = session.on_frame(decoder.frame());
      using Kind = RendezvousSession::Step::Kind;
      if (step.kind != Kind::kContinue) {
        summary.closed = true;
        summary.refused += step.kind == Kind::kRefused ? 1 : 0;
      } else if (step.hello_reply) {
        summary.accepted = true;
        decoder.set_limit(options.max_frame_bytes);
      } else if (step.answer) {
        const auto status = step.answer->response.status();
        summary.responses_ok += status == proto::STATUS_OK ? 1 : 0;
        summary.responses_invalid += status == proto::STATUS_INVALID_ARGUMENT ? 1 : 0;
        summary.responses_timeout += status == proto::STATUS_TIMEOUT ? 1 : 0;
      } else {
        check(step.waiter != nullptr, "a request got neither a response nor a waiter");
        ++summary.waiters;
        waiters.push_back(std::move(step.waiter));
      }
      decoder.next();
    }
  }
  io.poll();  // deadlines already due (timeout 0) answer TIMEOUT now
  // The connection closes: its waits are dropped, as Connection::close does.
  for (const auto& waiter : waiters) state.drop(waiter);
  check(state.num_waiters() == 0, "pending waits left after the connection's waits were dropped");
  check(summary.async_replies <= summary.waiters, "more late answers than waiters");
  state.clear();
  return summary;
}

}  // namespace hsgd::comm::fuzz
