#pragma once
// Certificates for tests of comm/tls's certificate mode, made with OpenSSL's API: a CA (a
// self-signed P-256 certificate with basicConstraints CA:TRUE) and leaf certificates it signs,
// written as PEM files into a directory that is removed with the object.
//
// Usage:
//   hsgd::testing::TestAuthority site("site");
//   const hsgd::comm::tls::CertificateFiles node_a = site.issue("node-a");

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/tls/tls.h"

namespace hsgd::testing {

class TestAuthority {
 public:
  explicit TestAuthority(const std::string& name) {
    std::string pattern = (std::filesystem::temp_directory_path() / "hsgd-ca-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = pattern;
    key_ = EVP_EC_gen("P-256");
    if (key_ == nullptr) throw std::runtime_error("EVP_EC_gen failed");
    cert_ = make(name, key_, nullptr, key_, /*authority=*/true);
    authority_ = (dir_ / "ca.pem").string();
    write_certificate(cert_, authority_);
  }
  ~TestAuthority() {
    X509_free(cert_);
    EVP_PKEY_free(key_);
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  TestAuthority(const TestAuthority&) = delete;
  TestAuthority& operator=(const TestAuthority&) = delete;

  // A certificate for common_name signed by this CA, its key, and this CA's certificate as the
  // authority to verify peers against.
  comm::tls::CertificateFiles issue(const std::string& common_name) {
    EVP_PKEY* key = EVP_EC_gen("P-256");
    if (key == nullptr) throw std::runtime_error("EVP_EC_gen failed");
    X509* cert = make(common_name, key, cert_, key_, /*authority=*/false);
    comm::tls::CertificateFiles files{.certificate = (dir_ / (common_name + ".pem")).string(),
                                      .private_key = (dir_ / (common_name + ".key")).string(),
                                      .authority = authority_};
    write_certificate(cert, files.certificate);
    FILE* out = std::fopen(files.private_key.c_str(), "w");
    const bool ok = out != nullptr &&
                    PEM_write_PrivateKey(out, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
    if (out != nullptr) std::fclose(out);
    X509_free(cert);
    EVP_PKEY_free(key);
    if (!ok) throw std::runtime_error("writing " + files.private_key + " failed");
    return files;
  }

  const std::string& authority() const { return authority_; }
  std::filesystem::path dir() const { return dir_; }

 private:
  // A certificate for key, signed by signer_key (issuer: issuer's subject, or itself).
  static X509* make(const std::string& common_name, EVP_PKEY* key, X509* issuer,
                    EVP_PKEY* signer_key, bool authority) {
    static long serial = 1;
    X509* cert = X509_new();
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), serial++);
    X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert), 7 * 24 * 3600);
    X509_set_pubkey(cert, key);
    X509_NAME* name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1,
                               0);
    X509_set_issuer_name(cert, issuer != nullptr ? X509_get_subject_name(issuer) : name);
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer != nullptr ? issuer : cert, cert, nullptr, nullptr, 0);
    const char* constraints = authority ? "critical,CA:TRUE" : "critical,CA:FALSE";
    const char* usage = authority ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature";
    for (const auto& [nid, value] :
         {std::pair{NID_basic_constraints, constraints}, std::pair{NID_key_usage, usage},
          std::pair{NID_subject_key_identifier, "hash"}}) {
      X509_EXTENSION* extension = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
      if (extension == nullptr) throw std::runtime_error("X509V3_EXT_conf_nid failed");
      X509_add_ext(cert, extension, -1);
      X509_EXTENSION_free(extension);
    }
    if (X509_sign(cert, signer_key, EVP_sha256()) == 0) throw std::runtime_error("X509_sign failed");
    return cert;
  }

  static void write_certificate(X509* cert, const std::string& path) {
    FILE* out = std::fopen(path.c_str(), "w");
    const bool ok = out != nullptr && PEM_write_X509(out, cert) == 1;
    if (out != nullptr) std::fclose(out);
    if (!ok) throw std::runtime_error("writing " + path + " failed");
  }

  std::filesystem::path dir_;
  EVP_PKEY* key_ = nullptr;
  X509* cert_ = nullptr;
  std::string authority_;
};

// Sets HSGD_TLS_CERT, HSGD_TLS_KEY and HSGD_TLS_CA for its lifetime (contexts created meanwhile
// use the certificates), then restores what they were; scopes nest.
class ScopedCertificateEnvironment {
 public:
  explicit ScopedCertificateEnvironment(const comm::tls::CertificateFiles& files) {
    set(comm::tls::kCertificateVariable, files.certificate);
    set(comm::tls::kPrivateKeyVariable, files.private_key);
    set(comm::tls::kAuthorityVariable, files.authority);
  }
  ~ScopedCertificateEnvironment() {
    for (const auto& [name, value] : previous_) {
      if (value) {
        ::setenv(name, value->c_str(), 1);
      } else {
        ::unsetenv(name);
      }
    }
  }
  ScopedCertificateEnvironment(const ScopedCertificateEnvironment&) = delete;
  ScopedCertificateEnvironment& operator=(const ScopedCertificateEnvironment&) = delete;

 private:
  void set(const char* name, const std::string& value) {
    const char* old = std::getenv(name);
    previous_.emplace_back(name, old != nullptr ? std::optional<std::string>(old) : std::nullopt);
    ::setenv(name, value.c_str(), 1);
  }
  std::vector<std::pair<const char*, std::optional<std::string>>> previous_;
};

}  // namespace hsgd::testing
