#pragma once
// One fuzz input = what one client connection sends to the rendezvous server, run through the
// server's own frame decoder (FrameDecoder) and dispatcher (RendezvousSession over a
// RendezvousState), without sockets. Shared by the libFuzzer target (rendezvous_fuzz_target.cpp,
// built by scripts/fuzz.sh with clang) and the replay test of the normal suite.
//
// Input format: byte 0 chooses the chunk size the rest is fed in (1 + byte % 64), so that the
// fuzzer also explores frames split across reads; the rest is the byte stream. The server runs
// with small limits (64 KiB frames, 64 keys, 64 KiB and 8 waits per job, 4 jobs), and the
// connection has proved job "fuzz" (as its TLS handshake would), so that every refusal path of
// the Hello is reachable.
//
// Checks (abort on failure, so the fuzzer reports them): pending waits all go away when the
// connection's waits are dropped, and no exception escapes.

#include <cstddef>
#include <cstdint>

namespace hsgd::comm::fuzz {

struct Summary {
  int frames = 0;             // complete frames given to the session
  bool accepted = false;      // the handshake was accepted
  int refused = 0;            // handshake refusals (0 or 1)
  int responses_ok = 0;       // requests answered at once with STATUS_OK
  int responses_invalid = 0;  // ... with STATUS_INVALID_ARGUMENT
  int responses_timeout = 0;  // ... with STATUS_TIMEOUT
  int waiters = 0;            // requests that had to wait
  int async_replies = 0;      // waiters answered (woken or timed out) before the end
  bool closed = false;        // the server would close the connection (refusal, malformed,
                              // oversized frame)
};

Summary run_input(const uint8_t* data, size_t size);

}  // namespace hsgd::comm::fuzz
