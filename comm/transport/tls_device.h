#pragma once
// hsgd's Gloo transport over TLS 1.3: a gloo::transport::Device whose pairs are TLS connections
// keyed by the job token (comm/tls), so Gloo's algorithms run unchanged on an encrypted and
// authenticated data plane.
//
// Contract:
// - The device listens on one port (options.host, a free port) for its whole life; every pair of
//   every context created from it is reached there. Pairs are created by createContext() and
//   connected by gloo::rendezvous::Context::connectFullMesh as for Gloo's TCP transport.
// - Of two ranks, the lower connects to the higher and presents the identity
//   psk_identity("data", job, "<from> -> <to> <pair id>"); the key is derive_psk(token, identity).
//   The accepting device answers only an identity of its job naming one of its pairs that waits
//   for exactly that peer, so a connection is bound to (job, source rank, target rank, pair).
// - Accepted connections are handshaken off the accept path, each within
//   options.handshake_timeout. One that fails (no TLS, wrong token, wrong identity, too slow, a
//   second connection for a connected pair) is closed and logged; it takes no pair's place, so
//   the real peer still connects.
// - Every wait of a pair or buffer ends within the context's timeout (gloo::IoException naming
//   the peer rank); Pair::close() (gloo::Context::closeConnections) fails the pair's pending
//   operations at once, here and, through the closed socket, on the peer.
//
// Usage (a HashStore here; across processes, a store every rank reaches):
//   #include <gloo/rendezvous/context.h>
//   #include <gloo/rendezvous/hash_store.h>
//   gloo::rendezvous::HashStore store;
//   const std::string token = "the job token";
//   auto device = hsgd::comm::transport::create_tls_device(
//       {.host = "10.0.0.5", .job_id = "job42", .token = token});
//   auto context = std::make_shared<gloo::rendezvous::Context>(/*rank=*/0, /*size=*/2);
//   context->connectFullMesh(store, device);

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace gloo::transport {
class Device;
}

namespace hsgd::comm::transport {

struct TlsDeviceOptions {
  std::string host = "127.0.0.1";  // the address to listen on and to publish to peers
  std::string job_id = "default";  // part of every identity: keys of one job open no other's
  std::string token;               // the job's secret; must not be empty
  // How long an accepted connection may take to complete its handshake.
  std::chrono::milliseconds handshake_timeout = std::chrono::seconds(10);
  // Accepted connections handshaking at once; more are closed at once (and logged).
  int max_handshakes = 64;
};

// Throws hsgd::InvalidArgument for an empty token, hsgd::CommError when the port cannot be opened.
std::shared_ptr<gloo::transport::Device> create_tls_device(const TlsDeviceOptions& options);

// The bytes that every pair of every context of device has written so far (frame headers and
// payloads, before TLS adds its records), or nullopt when device is not one of
// create_tls_device's (Gloo's plain TCP device counts nothing). Thread-safe.
std::optional<uint64_t> tls_bytes_written(const gloo::transport::Device& device);

}  // namespace hsgd::comm::transport
