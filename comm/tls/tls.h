#pragma once
// TLS 1.3 with pre-shared keys derived from a job token, through OpenSSL: the one way processes
// of a job authenticate and encrypt their connections (rendezvous, store, agents, data plane).
//
// Contract:
// - Only TLS 1.3, cipher suite TLS_AES_128_GCM_SHA256, key exchange psk_dhe_ke (the PSK
//   authenticates; an ephemeral X25519/ECDHE share gives forward secrecy). No certificates, no
//   session tickets, no renegotiation: after the handshake the connection carries only records.
// - The client names itself with an identity string ("hsgd1 store job42 node-a", see
//   psk_identity()); the PSK of a connection is derive_psk(token, identity), so a key is bound
//   to the identity it was derived for and a handshake under one identity proves nothing about
//   another. The server derives the same key from the identity the client presents, through a
//   lookup it supplies (which token belongs to that job), and learns the identity only once the
//   handshake proved the client holds the key.
// - Anyone holding the token can derive every identity's key: the token is the job's trust
//   root, as a shared secret always is.
// - A peer without the key fails the handshake; nothing it sent reaches the application.
//
// Usage (client, blocking with a deadline; fd: a connected non-blocking socket):
//   int fd = -1;
//   const std::string token = "the job token";
//   const std::string id = hsgd::comm::tls::psk_identity("store", "job42", "node-a");
//   const auto deadline = hsgd::comm::tls::Clock::now() + std::chrono::seconds(10);
//   hsgd::comm::tls::Stream stream(fd, hsgd::comm::tls::Context::client(),
//                                  hsgd::comm::tls::Role::kClient);
//   stream.set_client_psk(id, hsgd::comm::tls::derive_psk(token, id));
//   stream.handshake(deadline);
//   stream.write_all("hello", 5, deadline);

#include <openssl/ssl.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace hsgd::comm::tls {

using Psk = std::array<uint8_t, 32>;
using Clock = std::chrono::steady_clock;

// HKDF-SHA256 of the token, bound to identity. Deterministic: both ends compute it.
Psk derive_psk(std::string_view token, std::string_view identity);

// "hsgd1 <purpose> <job> <who>": the identity a client presents. purpose: "store", "data", ...;
// who: a name for the client ("rank 3 -> 5", a node name). Spaces inside fields are kept.
std::string psk_identity(std::string_view purpose, std::string_view job, std::string_view who);

// The job field of an identity made by psk_identity(), or nullopt when it is not one.
std::optional<std::string> identity_job(std::string_view identity);

// A TLS failure: the handshake (wrong key, not TLS), the peer closing, or a deadline.
struct Failure : std::runtime_error {
  Failure(bool timed_out, const std::string& what) : std::runtime_error(what), timed_out(timed_out) {}
  bool timed_out;
};

enum class Role { kClient, kServer };

// The key a server holds for a client identity; nullopt refuses the client.
using PskLookup = std::function<std::optional<Psk>(std::string_view identity)>;

// An OpenSSL SSL_CTX configured as described above; shared by many connections.
class Context {
 public:
  static std::shared_ptr<Context> client();
  static std::shared_ptr<Context> server(PskLookup lookup);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  SSL_CTX* native() const { return ctx_; }
  const PskLookup& lookup() const { return lookup_; }

 private:
  explicit Context(SSL_CTX* ctx, PskLookup lookup) : ctx_(ctx), lookup_(std::move(lookup)) {}
  SSL_CTX* ctx_;
  PskLookup lookup_;
};

// What a connection knows about its keys; attached to each SSL object (attach()).
struct ConnectionKeys {
  std::string client_identity;        // client: the identity it presents
  Psk client_psk{};                   // client: its key
  std::string authenticated_identity; // server: the client's identity, once its key matched
};

// Attaches keys to ssl (which must outlive no longer than keys); both ends call it before the
// handshake. Servers (including Boost.Asio's ssl::stream) use it through their native handle.
void attach(SSL* ssl, ConnectionKeys* keys);

// The last OpenSSL errors as text, emptying the queue ("" when there were none).
std::string openssl_errors();

// A blocking TLS connection over a non-blocking socket that the caller owns; every call has a
// deadline. Each Stream is used by one thread at a time.
class Stream {
 public:
  Stream(int fd, std::shared_ptr<Context> context, Role role);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  void set_client_psk(std::string identity, const Psk& psk);
  void handshake(Clock::time_point deadline);
  // The identity the client proved (server side, after the handshake).
  const std::string& peer_identity() const { return keys_.authenticated_identity; }

  void write_all(const void* data, size_t size, Clock::time_point deadline);
  void read_exact(void* out, size_t size, Clock::time_point deadline);
  // Reads what is available, at most size bytes, waiting until at least one byte or deadline.
  size_t read_some(void* out, size_t size, Clock::time_point deadline);
  // True when the stream holds decrypted bytes not yet read (poll() on the fd misses those).
  bool has_buffered() const;
  int fd() const { return fd_; }

 private:
  // Runs op until it succeeds, waiting on the socket as OpenSSL asks; returns op's result.
  int drive(const char* what, Clock::time_point deadline, const std::function<int()>& op);

  int fd_;
  std::shared_ptr<Context> context_;
  SSL* ssl_;
  ConnectionKeys keys_;
};

}  // namespace hsgd::comm::tls
