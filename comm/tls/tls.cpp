#include "comm/tls/tls.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/x509.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace hsgd::comm::tls {
namespace {

constexpr std::string_view kIdentityPrefix = "hsgd1 ";
constexpr std::string_view kPskSalt = "hsgd tls 1.3 psk";
// TLS_AES_128_GCM_SHA256's code point: the one suite both ends use.
constexpr unsigned char kSuite[2] = {0x13, 0x01};

int keys_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}

int context_index() {
  static const int index = SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}

ConnectionKeys* keys_of(SSL* ssl) {
  return static_cast<ConnectionKeys*>(SSL_get_ex_data(ssl, keys_index()));
}

// A TLS 1.3 session that carries psk as its resumption secret: OpenSSL's form of an external PSK.
SSL_SESSION* psk_session(SSL* ssl, const Psk& psk) {
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kSuite);
  if (cipher == nullptr) return nullptr;
  SSL_SESSION* session = SSL_SESSION_new();
  if (session == nullptr) return nullptr;
  if (SSL_SESSION_set1_master_key(session, psk.data(), psk.size()) != 1 ||
      SSL_SESSION_set_cipher(session, cipher) != 1 ||
      SSL_SESSION_set_protocol_version(session, TLS1_3_VERSION) != 1) {
    SSL_SESSION_free(session);
    return nullptr;
  }
  return session;
}

int use_session(SSL* ssl, const EVP_MD* md, const unsigned char** id, size_t* id_len,
                SSL_SESSION** session) {
  *session = nullptr;
  ConnectionKeys* keys = keys_of(ssl);
  if (keys == nullptr || keys->client_identity.empty()) return 1;  // no PSK: the handshake fails
  SSL_SESSION* made = psk_session(ssl, keys->client_psk);
  if (made == nullptr) return 0;
  if (md != nullptr && md != SSL_CIPHER_get_handshake_digest(SSL_SESSION_get0_cipher(made))) {
    SSL_SESSION_free(made);
    return 1;
  }
  *id = reinterpret_cast<const unsigned char*>(keys->client_identity.data());
  *id_len = keys->client_identity.size();
  *session = made;
  return 1;
}

int find_session(SSL* ssl, const unsigned char* id, size_t id_len, SSL_SESSION** session) {
  *session = nullptr;
  const auto* context =
      static_cast<const Context*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), context_index()));
  ConnectionKeys* keys = keys_of(ssl);
  if (context == nullptr || keys == nullptr || !context->lookup()) return 0;
  const std::string_view identity(reinterpret_cast<const char*>(id), id_len);
  const std::optional<Psk> psk = context->lookup()(identity);
  if (!psk) return 0;  // an unknown identity ends the handshake
  *session = psk_session(ssl, *psk);
  if (*session == nullptr) return 0;
  // Read only after a successful handshake, which proves the client holds this identity's key.
  keys->authenticated_identity = std::string(identity);
  return 1;
}

SSL_CTX* new_context(const SSL_METHOD* method) {
  SSL_CTX* ctx = SSL_CTX_new(method);
  if (ctx == nullptr) throw Failure(false, "SSL_CTX_new: " + openssl_errors());
  bool ok = SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) == 1 &&
            SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) == 1 &&
            SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256") == 1 &&
            SSL_CTX_set_num_tickets(ctx, 0) == 1;
  if (!ok) {
    const std::string why = openssl_errors();
    SSL_CTX_free(ctx);
    throw Failure(false, "configuring TLS 1.3: " + why);
  }
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  return ctx;
}

// The exporter label of the identity exchange; the prover's role is the exporter's context, so
// the client's and the server's proofs differ.
constexpr std::string_view kProofLabel = "EXPORTER-hsgd-identity";

void check_readable(const std::string& path, const char* variable, const char* what) {
  if (path.empty()) throw Failure(false, std::string(what) + " file is empty (" + variable + ")");
  if (::access(path.c_str(), R_OK) != 0) {
    throw Failure(false, "cannot read the " + std::string(what) + " file '" + path + "' (" +
                             variable + "): " + std::strerror(errno));
  }
}

// Mutual verification against files.authority, presenting files.certificate.
void use_certificates(SSL_CTX* ctx, const CertificateFiles& files) {
  check_readable(files.certificate, kCertificateVariable, "certificate");
  check_readable(files.private_key, kPrivateKeyVariable, "private key");
  check_readable(files.authority, kAuthorityVariable, "CA");
  if (SSL_CTX_use_certificate_chain_file(ctx, files.certificate.c_str()) != 1) {
    throw Failure(false, "the certificate file '" + files.certificate +
                             "' holds no usable PEM certificate: " + openssl_errors());
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, files.private_key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    if (ERR_GET_REASON(ERR_peek_last_error()) != X509_R_KEY_VALUES_MISMATCH) {
      throw Failure(false, "the private key file '" + files.private_key +
                               "' holds no usable PEM key: " + openssl_errors());
    }
    throw Failure(false, "the private key '" + files.private_key +
                             "' does not belong to the certificate '" + files.certificate +
                             "': " + openssl_errors());
  }
  if (SSL_CTX_load_verify_locations(ctx, files.authority.c_str(), nullptr) != 1) {
    throw Failure(false, "the CA file '" + files.authority +
                             "' holds no usable PEM certificate: " + openssl_errors());
  }
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
}

SSL_CTX* configured(SSL_CTX* ctx, const std::optional<CertificateFiles>& certificates) {
  if (!certificates) return ctx;
  try {
    use_certificates(ctx, *certificates);
  } catch (...) {
    SSL_CTX_free(ctx);
    throw;
  }
  return ctx;
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

void wait_ready(int fd, short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return;  // ready, or an error that the next call reports
    if (n == 0) throw Failure(true, std::string(what) + ": no progress before the deadline");
    if (errno != EINTR) throw Failure(false, std::string(what) + ": poll: " + std::strerror(errno));
  }
}

}  // namespace

Psk derive_psk(std::string_view token, std::string_view identity) {
  if (token.empty()) throw Failure(false, "derive_psk: an empty token keys nothing");
  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  EVP_KDF_CTX* kctx = kdf != nullptr ? EVP_KDF_CTX_new(kdf) : nullptr;
  EVP_KDF_free(kdf);
  if (kctx == nullptr) throw Failure(false, "HKDF unavailable: " + openssl_errors());
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<char*>(token.data()),
                                        token.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, const_cast<char*>(kPskSalt.data()),
                                        kPskSalt.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<char*>(identity.data()),
                                        identity.size()),
      OSSL_PARAM_construct_end()};
  Psk psk{};
  const int rc = EVP_KDF_derive(kctx, psk.data(), psk.size(), params);
  EVP_KDF_CTX_free(kctx);
  if (rc != 1) throw Failure(false, "HKDF: " + openssl_errors());
  return psk;
}

std::string psk_identity(std::string_view purpose, std::string_view job, std::string_view who) {
  std::string out(kIdentityPrefix);
  out.append(purpose).append(" ").append(job).append(" ").append(who);
  return out;
}

std::optional<std::string> identity_job(std::string_view identity) {
  if (identity.substr(0, kIdentityPrefix.size()) != kIdentityPrefix) return std::nullopt;
  identity.remove_prefix(kIdentityPrefix.size());
  const size_t purpose_end = identity.find(' ');
  if (purpose_end == std::string_view::npos || purpose_end == 0) return std::nullopt;
  identity.remove_prefix(purpose_end + 1);
  const size_t job_end = identity.find(' ');
  if (job_end == 0) return std::nullopt;
  return std::string(identity.substr(0, job_end));
}

std::optional<CertificateFiles> certificate_files_from_environment() {
  const char* certificate = std::getenv(kCertificateVariable);
  const char* key = std::getenv(kPrivateKeyVariable);
  const char* authority = std::getenv(kAuthorityVariable);
  if (certificate == nullptr && key == nullptr && authority == nullptr) return std::nullopt;
  std::string missing;
  for (const auto& [value, name] : {std::pair{certificate, kCertificateVariable},
                                    std::pair{key, kPrivateKeyVariable},
                                    std::pair{authority, kAuthorityVariable}}) {
    if (value == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(name);
  }
  if (!missing.empty()) {
    throw Failure(false, "certificates need all of HSGD_TLS_CERT, HSGD_TLS_KEY and HSGD_TLS_CA; " +
                             missing + " not set");
  }
  return CertificateFiles{certificate, key, authority};
}

void set_certificate_environment(const CertificateFiles& files) {
  (void)Context::client(files);  // every file is readable and fits the others
  const auto absolute = [](const std::string& path) {
    char* resolved = ::realpath(path.c_str(), nullptr);
    std::string out = resolved != nullptr ? resolved : path;
    std::free(resolved);
    return out;
  };
  ::setenv(kCertificateVariable, absolute(files.certificate).c_str(), 1);
  ::setenv(kPrivateKeyVariable, absolute(files.private_key).c_str(), 1);
  ::setenv(kAuthorityVariable, absolute(files.authority).c_str(), 1);
}

std::optional<std::string> certificate_flags_problem(const CertificateFiles& given) {
  std::string missing;
  for (const auto& [value, flag] : {std::pair{&given.certificate, "--tls-cert"},
                                    std::pair{&given.private_key, "--tls-key"},
                                    std::pair{&given.authority, "--tls-ca"}}) {
    if (value->empty()) missing += (missing.empty() ? "" : ", ") + std::string(flag);
  }
  if (missing.empty() || missing == "--tls-cert, --tls-key, --tls-ca") return std::nullopt;
  return "certificates need --tls-cert, --tls-key and --tls-ca together (or HSGD_TLS_CERT, "
         "HSGD_TLS_KEY, HSGD_TLS_CA); missing: " +
         missing;
}

std::shared_ptr<Context> Context::client(std::optional<CertificateFiles> certificates) {
  SSL_CTX* ctx = configured(new_context(TLS_client_method()), certificates);
  if (!certificates) {
    SSL_CTX_set_psk_use_session_callback(ctx, use_session);
    // A server that ignores the key and presents a certificate instead must not be talked to:
    // with an empty trust store every certificate fails verification, while a PSK handshake
    // sends none.
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  }
  return std::shared_ptr<Context>(new Context(ctx, nullptr, certificates.has_value()));
}

std::shared_ptr<Context> Context::server(PskLookup lookup,
                                         std::optional<CertificateFiles> certificates) {
  SSL_CTX* ctx = configured(new_context(TLS_server_method()), certificates);
  if (!certificates) SSL_CTX_set_psk_find_session_callback(ctx, find_session);
  std::shared_ptr<Context> context(new Context(ctx, std::move(lookup), certificates.has_value()));
  SSL_CTX_set_ex_data(ctx, context_index(), context.get());
  return context;
}

Context::~Context() { SSL_CTX_free(ctx_); }

void attach(SSL* ssl, ConnectionKeys* keys) { SSL_set_ex_data(ssl, keys_index(), keys); }

std::string openssl_errors() {
  std::string out;
  while (const unsigned long code = ERR_get_error()) {
    char text[256];
    ERR_error_string_n(code, text, sizeof(text));
    if (!out.empty()) out += "; ";
    out += text;
  }
  return out;
}

Proof identity_proof(SSL* ssl, const Psk& psk, Role prover) {
  std::array<uint8_t, 32> exported{};
  const unsigned char role = prover == Role::kClient ? 'c' : 's';
  if (SSL_export_keying_material(ssl, exported.data(), exported.size(), kProofLabel.data(),
                                 kProofLabel.size(), &role, 1, 1) != 1) {
    throw Failure(false, "exporting the identity secret: " + openssl_errors());
  }
  Proof proof{};
  size_t length = 0;
  if (EVP_Q_mac(nullptr, "HMAC", nullptr, "SHA256", nullptr, psk.data(), psk.size(),
                exported.data(), exported.size(), proof.data(), proof.size(), &length) == nullptr ||
      length != proof.size()) {
    throw Failure(false, "HMAC of the identity secret: " + openssl_errors());
  }
  return proof;
}

std::string identity_claim(SSL* ssl, const ConnectionKeys& keys) {
  const std::string& identity = keys.client_identity;
  if (identity.empty() || identity.size() > kMaxClaimedIdentityBytes) {
    throw Failure(false, "a certificate connection's identity has " +
                             std::to_string(identity.size()) + " bytes; expected 1 to " +
                             std::to_string(kMaxClaimedIdentityBytes) + " (set_client_psk)");
  }
  const Proof proof = identity_proof(ssl, keys.client_psk, Role::kClient);
  std::string claim;
  claim.push_back(static_cast<char>(identity.size() >> 8));
  claim.push_back(static_cast<char>(identity.size() & 0xff));
  claim += identity;
  claim.append(reinterpret_cast<const char*>(proof.data()), proof.size());
  return claim;
}

size_t claimed_identity_bytes(const uint8_t header[2]) {
  const size_t length = (static_cast<size_t>(header[0]) << 8) | header[1];
  if (length == 0 || length > kMaxClaimedIdentityBytes) {
    throw Failure(false, "the client claims an identity of " + std::to_string(length) +
                             " bytes; expected 1 to " + std::to_string(kMaxClaimedIdentityBytes));
  }
  return length;
}

Answer answer_identity_claim(SSL* ssl, const Context& context, std::string_view identity,
                             const Proof& proof, ConnectionKeys* keys, std::string* why) {
  Answer answer{};
  answer[0] = kRefused;
  const std::optional<Psk> psk = context.lookup() ? context.lookup()(identity) : std::nullopt;
  if (!psk) {
    *why = "the client's identity '" + std::string(identity) +
           "' names no job this server holds a token for";
    return answer;
  }
  const Proof expected = identity_proof(ssl, *psk, Role::kClient);
  if (CRYPTO_memcmp(expected.data(), proof.data(), proof.size()) != 0) {
    *why = "the client's proof for identity '" + std::string(identity) +
           "' does not match: its certificate is the site's, but it does not hold this job's "
           "token";
    return answer;
  }
  keys->authenticated_identity = std::string(identity);
  const Proof mine = identity_proof(ssl, *psk, Role::kServer);
  answer[0] = kAccepted;
  std::copy(mine.begin(), mine.end(), answer.begin() + 1);
  return answer;
}

void check_server_answer(SSL* ssl, const ConnectionKeys& keys, const Answer& answer) {
  if (answer[0] == kRefused) {
    throw Failure(false, "the server refused identity '" + keys.client_identity +
                             "': this client's token is not the one the server holds for the "
                             "job (or the server holds none for it)");
  }
  const Proof expected = identity_proof(ssl, keys.client_psk, Role::kServer);
  if (answer[0] != kAccepted ||
      CRYPTO_memcmp(expected.data(), answer.data() + 1, expected.size()) != 0) {
    throw Failure(false, "the server's proof for identity '" + keys.client_identity +
                             "' does not match: its certificate is the site's, but it does not "
                             "hold this job's token");
  }
}

void exchange_identity_proofs(SSL* ssl, const Context& context, Role role, ConnectionKeys* keys,
                              const std::function<void(const void*, size_t)>& write_all,
                              const std::function<void(void*, size_t)>& read_exact) {
  if (role == Role::kClient) {
    const std::string claim = identity_claim(ssl, *keys);
    Answer answer{};
    try {
      write_all(claim.data(), claim.size());
      read_exact(answer.data(), answer.size());
    } catch (const Failure& failure) {
      const std::string what = failure.what();
      if (what.find("alert") == std::string::npos) throw;
      // TLS 1.3 ends the client's handshake before the server checked its certificate: the
      // server's verdict on it arrives as an alert here.
      throw Failure(false, "the server refused this client's certificate (" + what +
                               "): is it signed by the CA the server trusts?");
    }
    check_server_answer(ssl, *keys, answer);
    return;
  }
  uint8_t header[2];
  read_exact(header, sizeof(header));
  std::string identity(claimed_identity_bytes(header), '\0');
  read_exact(identity.data(), identity.size());
  Proof proof{};
  read_exact(proof.data(), proof.size());
  std::string why;
  const Answer answer = answer_identity_claim(ssl, context, identity, proof, keys, &why);
  write_all(answer.data(), answer.size());
  if (!why.empty()) throw Failure(false, why);
}

std::string handshake_failure(SSL* ssl, const Context& context, const std::string& what) {
  const long result = SSL_get_verify_result(ssl);
  if (result == X509_V_OK) return what;
  if (!context.uses_certificates() && SSL_is_server(ssl) == 0) {
    return what + " (the server presented a certificate instead of using the job's key: it runs "
                  "with certificates, --tls-cert/--tls-key/--tls-ca, which this process was not "
                  "given; or it is not a server of this job)";
  }
  return what + " (the peer's certificate: " + X509_verify_cert_error_string(result) + ")";
}

Stream::Stream(int fd, std::shared_ptr<Context> context, Role role)
    : fd_(fd), context_(std::move(context)), ssl_(SSL_new(context_->native())) {
  if (ssl_ == nullptr) throw Failure(false, "SSL_new: " + openssl_errors());
  attach(ssl_, &keys_);
  SSL_set_mode(ssl_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_set_fd(ssl_, fd) != 1) {
    SSL_free(ssl_);
    throw Failure(false, "SSL_set_fd: " + openssl_errors());
  }
  if (role == Role::kClient) {
    SSL_set_connect_state(ssl_);
  } else {
    SSL_set_accept_state(ssl_);
  }
}

Stream::~Stream() { SSL_free(ssl_); }

void Stream::set_client_psk(std::string identity, const Psk& psk) {
  keys_.client_identity = std::move(identity);
  keys_.client_psk = psk;
}

int Stream::drive(const char* what, Clock::time_point deadline, const std::function<int()>& op) {
  for (;;) {
    ERR_clear_error();
    errno = 0;
    const int rc = op();
    if (rc > 0) return rc;
    switch (SSL_get_error(ssl_, rc)) {
      case SSL_ERROR_WANT_READ:
        wait_ready(fd_, POLLIN, deadline, what);
        break;
      case SSL_ERROR_WANT_WRITE:
        wait_ready(fd_, POLLOUT, deadline, what);
        break;
      case SSL_ERROR_ZERO_RETURN:
        throw Failure(false, std::string(what) + ": the peer closed the connection");
      case SSL_ERROR_SYSCALL: {
        const int error = errno;
        const std::string queued = openssl_errors();
        throw Failure(false, std::string(what) + ": " +
                                 (error != 0 ? std::strerror(error)
                                             : queued.empty() ? "the peer closed the connection"
                                                              : queued));
      }
      default: {
        const std::string queued = openssl_errors();
        throw Failure(false, std::string(what) + ": " + (queued.empty() ? "TLS error" : queued));
      }
    }
  }
}

void check_key_used(SSL* ssl, const Context& context) {
  if (context.uses_certificates() || SSL_is_server(ssl) == 1 || SSL_session_reused(ssl) == 1) {
    return;
  }
  throw Failure(false, "TLS handshake: the server did not use the job's key (a server that "
                       "authenticates otherwise is not a server of this job)");
}

void Stream::handshake(Clock::time_point deadline) {
  try {
    drive("TLS handshake", deadline, [&] { return SSL_do_handshake(ssl_); });
  } catch (const Failure& failure) {
    throw Failure(failure.timed_out, handshake_failure(ssl_, *context_, failure.what()));
  }
  check_key_used(ssl_, *context_);
  if (!context_->uses_certificates()) return;
  exchange_identity_proofs(
      ssl_, *context_, SSL_is_server(ssl_) == 1 ? Role::kServer : Role::kClient, &keys_,
      [&](const void* data, size_t size) { write_all(data, size, deadline); },
      [&](void* out, size_t size) { read_exact(out, size, deadline); });
}

void Stream::write_all(const void* data, size_t size, Clock::time_point deadline) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < size) {
    size_t written = 0;
    drive("TLS write", deadline,
          [&] { return SSL_write_ex(ssl_, bytes + done, size - done, &written); });
    done += written;
  }
}

void Stream::read_exact(void* out, size_t size, Clock::time_point deadline) {
  auto* bytes = static_cast<uint8_t*>(out);
  size_t done = 0;
  while (done < size) done += read_some(bytes + done, size - done, deadline);
}

size_t Stream::read_some(void* out, size_t size, Clock::time_point deadline) {
  size_t got = 0;
  drive("TLS read", deadline, [&] { return SSL_read_ex(ssl_, out, size, &got); });
  return got;
}

bool Stream::has_buffered() const { return SSL_pending(ssl_) > 0; }

}  // namespace hsgd::comm::tls
