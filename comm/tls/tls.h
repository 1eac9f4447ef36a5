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
// Certificates, an option for sites that have a PKI (CertificateFiles; hsgd-run --tls-cert,
// --tls-key, --tls-ca set HSGD_TLS_CERT, HSGD_TLS_KEY, HSGD_TLS_CA for every process of the job):
// - Each end presents its certificate and verifies the other's against the site's CA (mutual
//   TLS 1.3, ECDHE key exchange, no PSK: OpenSSL's TLS 1.3 cannot combine the two in one
//   handshake). A certificate says the host belongs to the site, not which job or rank it is.
// - So the token still binds the identity: right after the handshake the client sends
//   IdentityClaim (its identity and an HMAC, under the identity's derived key, of a secret
//   exported from this very connection); the server checks it through its lookup and answers
//   with its own proof; an end that finds a proof wrong closes before any application byte.
//   A connection thus needs a certificate of the site's CA *and* the job's token, and a proof
//   seen on one connection is worthless on another (the exported secret differs).
// - Streams and the transport's sockets run the exchange inside handshake(); the rendezvous
//   server (Boost.Asio) runs the same steps asynchronously.
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

// PEM files: this process's certificate (a chain may follow it), its private key, and the CA
// certificates that a peer's certificate must chain to.
struct CertificateFiles {
  std::string certificate;
  std::string private_key;
  std::string authority;
  bool operator==(const CertificateFiles&) const = default;
};

// The environment variables that select certificates for every process of a job.
inline constexpr const char* kCertificateVariable = "HSGD_TLS_CERT";
inline constexpr const char* kPrivateKeyVariable = "HSGD_TLS_KEY";
inline constexpr const char* kAuthorityVariable = "HSGD_TLS_CA";

// Certificates from HSGD_TLS_CERT, HSGD_TLS_KEY and HSGD_TLS_CA; nullopt when none is set.
// Throws Failure naming the missing ones when only some are set.
std::optional<CertificateFiles> certificate_files_from_environment();

// Makes files the certificates of this process and of the processes it starts: checks that they
// can be used (throws Failure naming the file otherwise), then sets the three variables to the
// files' absolute paths.
void set_certificate_environment(const CertificateFiles& files);

// What hsgd-run and hsgd-rendezvous say of certificate flags given as (--tls-cert, --tls-key,
// --tls-ca) values: nullopt when all or none are set, otherwise which are missing.
std::optional<std::string> certificate_flags_problem(const CertificateFiles& given);

// An OpenSSL SSL_CTX configured as described above; shared by many connections. Without
// certificates it keys connections by PSK; with them it runs mutual certificate verification
// plus the identity exchange. Every end of a job must be in the same mode. Throws Failure
// naming the file when a certificate, key or CA file cannot be used.
class Context {
 public:
  static std::shared_ptr<Context> client(
      std::optional<CertificateFiles> certificates = certificate_files_from_environment());
  static std::shared_ptr<Context> server(
      PskLookup lookup,
      std::optional<CertificateFiles> certificates = certificate_files_from_environment());
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  SSL_CTX* native() const { return ctx_; }
  const PskLookup& lookup() const { return lookup_; }
  bool uses_certificates() const { return uses_certificates_; }

 private:
  Context(SSL_CTX* ctx, PskLookup lookup, bool uses_certificates)
      : ctx_(ctx), lookup_(std::move(lookup)), uses_certificates_(uses_certificates) {}
  SSL_CTX* ctx_;
  PskLookup lookup_;
  bool uses_certificates_;
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

// The identity exchange of certificate mode, after a successful handshake on ssl.
using Proof = std::array<uint8_t, 32>;
inline constexpr size_t kMaxClaimedIdentityBytes = 1024;

// HMAC-SHA256 under psk of 32 bytes exported from ssl's connection for prover's role.
Proof identity_proof(SSL* ssl, const Psk& psk, Role prover);

// The client's claim on the wire: identity length (2 bytes, big-endian), identity, proof.
std::string identity_claim(SSL* ssl, const ConnectionKeys& keys);
// The identity length a claim's first 2 bytes announce; throws Failure when it is 0 or larger
// than kMaxClaimedIdentityBytes.
size_t claimed_identity_bytes(const uint8_t header[2]);
// The server's answer on the wire: kAccepted and the server's proof, or kRefused and zeros. A
// refusal is final for the client (its token or job is wrong), unlike a connection that ends.
inline constexpr uint8_t kAccepted = 'Y';
inline constexpr uint8_t kRefused = 'N';
using Answer = std::array<uint8_t, 1 + sizeof(Proof)>;
// Server: checks the claimed identity and proof through context's lookup. Accepted: records the
// identity in keys->authenticated_identity and returns the answer with the server's proof.
// Refused: returns the refusal and sets *why (naming the identity).
Answer answer_identity_claim(SSL* ssl, const Context& context, std::string_view identity,
                             const Proof& proof, ConnectionKeys* keys, std::string* why);
// Client: throws Failure unless answer accepts keys' identity with the server's proof.
void check_server_answer(SSL* ssl, const ConnectionKeys& keys, const Answer& answer);

// what, the text of a failed handshake on ssl, with the reason when the peer's certificate was
// refused (a PSK client meeting a server that presents a certificate is told so).
std::string handshake_failure(SSL* ssl, const Context& context, const std::string& what);

// A token-keyed client's check after its handshake: throws Failure unless the server accepted
// the key (with an empty trust store no certificate passes either, this is the second lock).
void check_key_used(SSL* ssl, const Context& context);

// Runs the whole exchange over blocking I/O (both functions honour the caller's deadline).
void exchange_identity_proofs(SSL* ssl, const Context& context, Role role, ConnectionKeys* keys,
                              const std::function<void(const void*, size_t)>& write_all,
                              const std::function<void(void*, size_t)>& read_exact);

// A blocking TLS connection over a non-blocking socket that the caller owns; every call has a
// deadline. Each Stream is used by one thread at a time.
class Stream {
 public:
  Stream(int fd, std::shared_ptr<Context> context, Role role);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  void set_client_psk(std::string identity, const Psk& psk);
  // The TLS handshake, and in certificate mode the identity exchange, before deadline.
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
