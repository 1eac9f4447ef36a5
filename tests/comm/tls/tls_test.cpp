#include "comm/tls/tls.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/test_certificates.h"

namespace tls = hsgd::comm::tls;
using hsgd::testing::TestAuthority;

namespace {

using namespace std::chrono_literals;

struct SocketPair {
  int client = -1;
  int server = -1;
  SocketPair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
    client = fds[0];
    server = fds[1];
  }
  ~SocketPair() {
    ::close(client);
    ::close(server);
  }
};

tls::Clock::time_point in(std::chrono::milliseconds ms) { return tls::Clock::now() + ms; }

// A server whose only job is "job42" with token "secret-42" (by default PSK; with certificates
// when given).
std::shared_ptr<tls::Context> job42_server(
    std::optional<tls::CertificateFiles> certificates = std::nullopt,
    std::string token = "secret-42") {
  return tls::Context::server(
      [token](std::string_view identity) -> std::optional<tls::Psk> {
        if (tls::identity_job(identity) != "job42") return std::nullopt;
        return tls::derive_psk(token, identity);
      },
      std::move(certificates));
}

// Runs the server's handshake on its own thread; returns its error text ("" on success) and the
// identity it authenticated.
struct ServerResult {
  std::string error;
  std::string identity;
  std::string received;
};

ServerResult serve(int fd, std::shared_ptr<tls::Context> context, size_t expect_bytes) {
  ServerResult result;
  try {
    tls::Stream stream(fd, std::move(context), tls::Role::kServer);
    stream.handshake(in(5s));
    result.identity = stream.peer_identity();
    result.received.resize(expect_bytes);
    stream.read_exact(result.received.data(), expect_bytes, in(5s));
    stream.write_all("ok", 2, in(5s));
  } catch (const tls::Failure& failure) {
    result.error = failure.what();
  }
  return result;
}

TEST(TlsTest, DerivedKeysDependOnTokenAndIdentity) {
  const std::string id = tls::psk_identity("store", "job42", "node-a");
  EXPECT_EQ(id, "hsgd1 store job42 node-a");
  EXPECT_EQ(tls::derive_psk("t", id), tls::derive_psk("t", id));
  EXPECT_NE(tls::derive_psk("t", id), tls::derive_psk("u", id));
  EXPECT_NE(tls::derive_psk("t", id), tls::derive_psk("t", tls::psk_identity("store", "job42", "node-b")));
  EXPECT_THROW(tls::derive_psk("", id), tls::Failure);
}

TEST(TlsTest, IdentityJobParsesOnlyWellFormedIdentities) {
  EXPECT_EQ(tls::identity_job("hsgd1 store job42 node-a"), "job42");
  EXPECT_EQ(tls::identity_job("hsgd1 data j rank 3 -> 5"), "j");
  EXPECT_EQ(tls::identity_job("hsgd2 store job42 x"), std::nullopt);
  EXPECT_EQ(tls::identity_job("hsgd1 store"), std::nullopt);
  EXPECT_EQ(tls::identity_job("hsgd1  job42 x"), std::nullopt);
}

TEST(TlsTest, ClientWithTheTokenConnectsAndTheServerLearnsItsIdentity) {
  SocketPair sockets;
  const auto server = job42_server();
  ServerResult result;
  std::thread server_thread([&] { result = serve(sockets.server, server, 11); });
  tls::Stream client(sockets.client, tls::Context::client(), tls::Role::kClient);
  const std::string id = tls::psk_identity("store", "job42", "node-a");
  client.set_client_psk(id, tls::derive_psk("secret-42", id));
  client.handshake(in(5s));
  client.write_all("hello world", 11, in(5s));
  char reply[2];
  client.read_exact(reply, 2, in(5s));
  server_thread.join();
  EXPECT_EQ(result.error, "");
  EXPECT_EQ(result.identity, id);
  EXPECT_EQ(result.received, "hello world");
  EXPECT_EQ(std::string(reply, 2), "ok");
}

TEST(TlsTest, WrongTokenFailsTheHandshakeOnBothSides) {
  SocketPair sockets;
  ServerResult result;
  std::thread server_thread([&] { result = serve(sockets.server, job42_server(), 1); });
  tls::Stream client(sockets.client, tls::Context::client(), tls::Role::kClient);
  const std::string id = tls::psk_identity("store", "job42", "node-a");
  client.set_client_psk(id, tls::derive_psk("guessed", id));
  EXPECT_THROW(client.handshake(in(5s)), tls::Failure);
  server_thread.join();
  EXPECT_NE(result.error, "");
  EXPECT_EQ(result.identity, "");
  EXPECT_EQ(result.received, "");
}

TEST(TlsTest, KeyOfOneIdentityDoesNotOpenAnother) {
  SocketPair sockets;
  ServerResult result;
  std::thread server_thread([&] { result = serve(sockets.server, job42_server(), 1); });
  tls::Stream client(sockets.client, tls::Context::client(), tls::Role::kClient);
  const std::string claimed = tls::psk_identity("store", "job42", "node-b");
  const std::string held = tls::psk_identity("store", "job42", "node-a");
  client.set_client_psk(claimed, tls::derive_psk("secret-42", held));
  EXPECT_THROW(client.handshake(in(5s)), tls::Failure);
  server_thread.join();
  EXPECT_NE(result.error, "");
}

TEST(TlsTest, UnknownJobAndClientWithoutKeyAreRefused) {
  for (const bool with_key : {true, false}) {
    SocketPair sockets;
    ServerResult result;
    std::thread server_thread([&] { result = serve(sockets.server, job42_server(), 1); });
    tls::Stream client(sockets.client, tls::Context::client(), tls::Role::kClient);
    if (with_key) {
      const std::string id = tls::psk_identity("store", "job7", "node-a");
      client.set_client_psk(id, tls::derive_psk("secret-42", id));
    }
    EXPECT_THROW(client.handshake(in(5s)), tls::Failure) << "with_key " << with_key;
    server_thread.join();
    EXPECT_NE(result.error, "") << "with_key " << with_key;
  }
}

TEST(TlsTest, GarbageInsteadOfAHandshakeFailsTheServerQuickly) {
  SocketPair sockets;
  ServerResult result;
  std::thread server_thread([&] { result = serve(sockets.server, job42_server(), 1); });
  std::vector<char> garbage(512);
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>(i * 37 + 11);
  ASSERT_EQ(::send(sockets.client, garbage.data(), garbage.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(garbage.size()));
  server_thread.join();
  EXPECT_NE(result.error, "");
  EXPECT_EQ(result.error.find("deadline"), std::string::npos) << result.error;
}

TEST(TlsTest, SilentPeerHitsTheDeadline) {
  SocketPair sockets;
  tls::Stream client(sockets.client, tls::Context::client(), tls::Role::kClient);
  const std::string id = tls::psk_identity("store", "job42", "node-a");
  client.set_client_psk(id, tls::derive_psk("secret-42", id));
  try {
    client.handshake(in(200ms));
    FAIL() << "the handshake completed with nobody answering";
  } catch (const tls::Failure& failure) {
    EXPECT_TRUE(failure.timed_out) << failure.what();
  }
}

TEST(TlsTest, RecordsOnTheWireDoNotContainThePlaintextOrTheToken) {
  SocketPair sockets;
  int tap[2];  // the client writes into tap[0]; the test copies tap[1] -> server, recording it
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, tap), 0);
  ServerResult result;
  const std::string secret_text = "weights-and-keys-0123456789";
  std::thread server_thread(
      [&] { result = serve(sockets.server, job42_server(), secret_text.size()); });
  std::string recorded;
  std::atomic<bool> stop{false};
  std::thread relay([&] {
    // Forwards tap[1] <-> sockets.client both ways, keeping what the client sent.
    char buffer[4096];
    while (!stop) {
      bool moved = false;
      ssize_t n = ::recv(tap[1], buffer, sizeof(buffer), 0);
      if (n > 0) {
        recorded.append(buffer, static_cast<size_t>(n));
        ::send(sockets.client, buffer, static_cast<size_t>(n), MSG_NOSIGNAL);
        moved = true;
      }
      n = ::recv(sockets.client, buffer, sizeof(buffer), 0);
      if (n > 0) {
        ::send(tap[1], buffer, static_cast<size_t>(n), MSG_NOSIGNAL);
        moved = true;
      }
      if (!moved) std::this_thread::sleep_for(1ms);
    }
  });
  {
    tls::Stream client(tap[0], tls::Context::client(), tls::Role::kClient);
    const std::string id = tls::psk_identity("store", "job42", "node-a");
    client.set_client_psk(id, tls::derive_psk("secret-42", id));
    client.handshake(in(5s));
    client.write_all(secret_text.data(), secret_text.size(), in(5s));
    char reply[2];
    client.read_exact(reply, 2, in(5s));
  }
  server_thread.join();
  stop = true;
  relay.join();
  ::close(tap[0]);
  ::close(tap[1]);
  EXPECT_EQ(result.received, secret_text);
  EXPECT_GT(recorded.size(), secret_text.size());
  EXPECT_EQ(recorded.find(secret_text), std::string::npos);
  EXPECT_EQ(recorded.find("secret-42"), std::string::npos);
}

// Certificate mode.

// An SSL object of context over fd with its handshake done (no identity exchange): what an
// attacker with a certificate of the site can reach on its own.
SSL* raw_handshake(int fd, const std::shared_ptr<tls::Context>& context, tls::Role role) {
  SSL* ssl = SSL_new(context->native());
  SSL_set_fd(ssl, fd);
  if (role == tls::Role::kClient) {
    SSL_set_connect_state(ssl);
  } else {
    SSL_set_accept_state(ssl);
  }
  const auto deadline = in(5s);
  for (;;) {
    const int rc = SSL_do_handshake(ssl);
    if (rc == 1) return ssl;
    const int error = SSL_get_error(ssl, rc);
    if ((error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) ||
        tls::Clock::now() > deadline) {
      ADD_FAILURE() << "raw handshake failed: " << tls::openssl_errors();
      SSL_free(ssl);
      return nullptr;
    }
    pollfd p{.fd = fd, .events = static_cast<short>(error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT),
             .revents = 0};
    ::poll(&p, 1, 100);
  }
}

void raw_write(SSL* ssl, int fd, const void* data, size_t size) {
  size_t written = 0;
  while (SSL_write_ex(ssl, data, size, &written) != 1) {
    pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
    ::poll(&p, 1, 100);
  }
}

struct Site {
  TestAuthority authority{"site"};
  tls::CertificateFiles server = authority.issue("server");
  tls::CertificateFiles client = authority.issue("client");
};

const std::string kNodeA = tls::psk_identity("store", "job42", "node-a");

TEST(TlsCertificateTest, SiteCertificatesAndTheTokenConnect_TheServerLearnsTheIdentity) {
  Site site;
  SocketPair sockets;
  const auto server = job42_server(site.server);
  EXPECT_TRUE(server->uses_certificates());
  ServerResult result;
  std::thread server_thread([&] { result = serve(sockets.server, server, 11); });
  tls::Stream client(sockets.client, tls::Context::client(site.client), tls::Role::kClient);
  client.set_client_psk(kNodeA, tls::derive_psk("secret-42", kNodeA));
  client.handshake(in(5s));
  client.write_all("hello world", 11, in(5s));
  char reply[2];
  client.read_exact(reply, 2, in(5s));
  server_thread.join();
  EXPECT_EQ(result.error, "");
  EXPECT_EQ(result.identity, kNodeA);
  EXPECT_EQ(result.received, "hello world");
  EXPECT_EQ(std::string(reply, 2), "ok");
}

TEST(TlsCertificateTest, CertificateOfAnotherAuthorityIsRefused) {
  Site site;
  TestAuthority other("other");
  SocketPair sockets;
  ServerResult result;
  std::thread server_thread([&] { result = serve(sockets.server, job42_server(site.server), 1); });
  // The stranger trusts the site's CA (it can see the server's certificate) but holds a
  // certificate of its own CA, and even the token.
  tls::CertificateFiles stranger = other.issue("stranger");
  stranger.authority = site.client.authority;
  tls::Stream client(sockets.client, tls::Context::client(stranger), tls::Role::kClient);
  client.set_client_psk(kNodeA, tls::derive_psk("secret-42", kNodeA));
  EXPECT_THROW(client.handshake(in(5s)), tls::Failure);
  server_thread.join();
  EXPECT_NE(result.error.find("certificate"), std::string::npos) << result.error;
  EXPECT_EQ(result.identity, "");
  EXPECT_EQ(result.received, "");
}

TEST(TlsCertificateTest, TokenKeyedClientAndCertificateServerRefuseEachOther) {
  Site site;
  SocketPair sockets;
  ServerResult result;
  std::thread server_thread([&] { result = serve(sockets.server, job42_server(site.server), 1); });
  // A PSK client with the right token: the server presents a certificate instead of using the
  // key, which the client refuses (a server that ignores the key is not the job's server).
  tls::Stream client(sockets.client, tls::Context::client(std::nullopt), tls::Role::kClient);
  client.set_client_psk(kNodeA, tls::derive_psk("secret-42", kNodeA));
  try {
    client.handshake(in(5s));
    ADD_FAILURE() << "a token-keyed client accepted a server's certificate";
  } catch (const tls::Failure& failure) {
    EXPECT_NE(std::string(failure.what()).find("presented a certificate instead"),
              std::string::npos)
        << failure.what();
  }
  ::shutdown(sockets.client, SHUT_RDWR);
  server_thread.join();
  EXPECT_NE(result.error, "");
  EXPECT_EQ(result.identity, "");
}

TEST(TlsCertificateTest, SiteCertificateWithoutTheTokenIsRefusedOnBothSides) {
  Site site;
  SocketPair sockets;
  ServerResult result;
  std::thread server_thread([&] { result = serve(sockets.server, job42_server(site.server), 1); });
  tls::Stream client(sockets.client, tls::Context::client(site.client), tls::Role::kClient);
  client.set_client_psk(kNodeA, tls::derive_psk("guessed", kNodeA));
  try {
    client.handshake(in(5s));
    ADD_FAILURE() << "the server accepted a client without the token";
  } catch (const tls::Failure& failure) {
    EXPECT_FALSE(failure.timed_out) << "the refusal must not wait for the deadline";
    EXPECT_NE(std::string(failure.what()).find("the server refused identity"), std::string::npos)
        << failure.what();
  }
  server_thread.join();
  EXPECT_NE(result.error.find("does not hold this job's token"), std::string::npos)
      << result.error;
  EXPECT_NE(result.error.find(kNodeA), std::string::npos) << result.error;
  EXPECT_EQ(result.identity, "");
}

TEST(TlsCertificateTest, ServerWithoutTheTokenIsRefusedByTheClient) {
  Site site;
  SocketPair sockets;
  // A host of the site posing as the job's server: it answers any claim with bytes of its own.
  std::thread rogue([&] {
    SSL* ssl = raw_handshake(sockets.server, job42_server(site.server), tls::Role::kServer);
    if (ssl == nullptr) return;
    tls::Answer made_up{};
    made_up[0] = tls::kAccepted;
    raw_write(ssl, sockets.server, made_up.data(), made_up.size());
    SSL_free(ssl);
  });
  tls::Stream client(sockets.client, tls::Context::client(site.client), tls::Role::kClient);
  client.set_client_psk(kNodeA, tls::derive_psk("secret-42", kNodeA));
  try {
    client.handshake(in(5s));
    ADD_FAILURE() << "the client accepted a server without the token";
  } catch (const tls::Failure& failure) {
    EXPECT_NE(std::string(failure.what()).find("server's proof"), std::string::npos)
        << failure.what();
  }
  rogue.join();
}

TEST(TlsCertificateTest, ProofSeenOnOneConnectionDoesNotOpenAnother) {
  Site site;
  const auto client_context = tls::Context::client(site.client);
  // Connection 1: the real client's claim, as an eavesdropper on its host could learn it.
  std::string claim;
  {
    SocketPair sockets;
    ServerResult result;
    std::thread server_thread(
        [&] { result = serve(sockets.server, job42_server(site.server), 0); });
    SSL* ssl = raw_handshake(sockets.client, client_context, tls::Role::kClient);
    ASSERT_NE(ssl, nullptr);
    tls::ConnectionKeys keys{.client_identity = kNodeA,
                             .client_psk = tls::derive_psk("secret-42", kNodeA),
                             .authenticated_identity = {}};
    claim = tls::identity_claim(ssl, keys);
    raw_write(ssl, sockets.client, claim.data(), claim.size());
    server_thread.join();
    SSL_free(ssl);
    ASSERT_EQ(result.error, "");  // the claim is the real one
    ASSERT_EQ(result.identity, kNodeA);
  }
  // Connection 2: a host of the site without the token replays it.
  SocketPair sockets;
  ServerResult result;
  std::thread server_thread([&] { result = serve(sockets.server, job42_server(site.server), 1); });
  SSL* ssl = raw_handshake(sockets.client, client_context, tls::Role::kClient);
  ASSERT_NE(ssl, nullptr);
  raw_write(ssl, sockets.client, claim.data(), claim.size());
  server_thread.join();
  SSL_free(ssl);
  EXPECT_NE(result.error.find("does not match"), std::string::npos) << result.error;
  EXPECT_EQ(result.identity, "");
}

TEST(TlsCertificateTest, UnusableFilesAreNamed) {
  Site site;
  TestAuthority other("other");
  tls::CertificateFiles missing = site.client;
  missing.private_key = "/nonexistent/node.key";
  tls::CertificateFiles mismatched = site.client;
  mismatched.private_key = other.issue("x").private_key;
  tls::CertificateFiles not_pem = site.client;
  not_pem.authority = (site.authority.dir() / "garbage.pem").string();
  std::ofstream(not_pem.authority) << "not a certificate\n";
  for (const auto& [files, expected] :
       {std::pair{missing, std::string("cannot read the private key file '/nonexistent/node.key' "
                                       "(HSGD_TLS_KEY)")},
        std::pair{mismatched, std::string("does not belong to the certificate")},
        std::pair{not_pem, std::string("holds no usable PEM certificate")}}) {
    try {
      tls::Context::client(files);
      ADD_FAILURE() << "no error for " << expected;
    } catch (const tls::Failure& failure) {
      EXPECT_NE(std::string(failure.what()).find(expected), std::string::npos) << failure.what();
    }
  }
}

TEST(TlsCertificateTest, EnvironmentSelectsCertificatesOnlyWhenComplete) {
  Site site;
  EXPECT_EQ(tls::certificate_files_from_environment(), std::nullopt);
  {
    hsgd::testing::ScopedCertificateEnvironment env(site.client);
    const auto files = tls::certificate_files_from_environment();
    ASSERT_TRUE(files.has_value());
    EXPECT_EQ(files->certificate, site.client.certificate);
    EXPECT_TRUE(tls::Context::client()->uses_certificates());
    ::unsetenv(tls::kAuthorityVariable);
    try {
      tls::certificate_files_from_environment();
      ADD_FAILURE() << "no error with HSGD_TLS_CA unset";
    } catch (const tls::Failure& failure) {
      EXPECT_NE(std::string(failure.what()).find("HSGD_TLS_CA not set"), std::string::npos)
          << failure.what();
    }
  }
  EXPECT_FALSE(tls::Context::client()->uses_certificates());
}

}  // namespace
