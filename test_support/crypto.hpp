#pragma once
// Keys, tokens and certificates made at run time with OpenSSL, for the TLS and identity
// tests: nothing secret is committed, and every test gets material of its own. A key pair
// signs JWTs and publishes itself as a JWK; a CA issues server and client certificates,
// with the names, SANs and validity a test asks for (expired, wrong name, another CA...).
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <openssl/evp.h>

namespace idem::test {

class KeyPair {
 public:
  static KeyPair rsa(int bits = 2048);
  // "P-256", "P-384" or "P-521".
  static KeyPair ec(std::string_view curve = "P-256");

  // The public half as a JWK object (RFC 7517), with "kid" (and "alg" when not empty).
  std::string public_jwk(std::string_view kid, std::string_view alg = {}) const;
  // The private key as PKCS#8 PEM.
  std::string private_pem() const;
  EVP_PKEY* get() const noexcept { return key_.get(); }
  bool is_ec() const noexcept { return !curve_.empty(); }

 private:
  std::shared_ptr<EVP_PKEY> key_;
  std::string curve_;
};

// {"keys":[...]} of the given JWK objects.
std::string jwks(const std::vector<std::string>& jwk_objects);

// A compact JWS: base64url(header).base64url(payload).base64url(signature), signed with
// `key` by `alg` (RS256/384/512, PS256/384/512, ES256/384/512; ES as raw R||S).
// `header_json` and `payload_json` are used as written, so a test can forge anything.
std::string sign_jwt(std::string_view header_json, std::string_view payload_json,
                     const KeyPair& key, std::string_view alg);
// A token with an arbitrary signature part (base64url of `signature`), for alg none and
// broken signatures.
std::string unsigned_jwt(std::string_view header_json, std::string_view payload_json,
                         std::string_view signature = {});
std::int64_t unix_now();

struct CertificateOptions {
  std::string common_name = "localhost";
  std::vector<std::string> dns = {"localhost"};
  std::vector<std::string> ips = {"127.0.0.1"};
  std::vector<std::string> uris;
  // Validity relative to now.
  std::chrono::seconds not_before = -std::chrono::hours(1);
  std::chrono::seconds not_after = std::chrono::hours(24);
  bool server = true;  // extendedKeyUsage serverAuth, else clientAuth
};

struct Certificate {
  std::string cert_pem;
  std::string key_pem;
};

// A self-signed CA that issues certificates.
class CertificateAuthority {
 public:
  explicit CertificateAuthority(std::string_view name = "idemproxy test CA");
  Certificate issue(const CertificateOptions& options) const;
  const std::string& cert_pem() const noexcept { return cert_pem_; }

 private:
  KeyPair key_;
  std::shared_ptr<struct x509_st> cert_;
  std::string cert_pem_;
};

// Writes `text` to dir/name (mode 0600) and returns the path as a string.
std::string write_file(const std::filesystem::path& dir, std::string_view name, std::string_view text);

}  // namespace idem::test
