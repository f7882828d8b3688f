#pragma once
// The public keys a bearer token may be signed with: a JWKS (RFC 7517) file, read at start
// and on every reload. Verification is done with OpenSSL directly (docs/architecture.md
// says why not libjwt). Only asymmetric signature keys are kept: RSA (2048 bits or more)
// and EC on P-256, P-384 and P-521. Pure apart from reading the file.
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <openssl/evp.h>

namespace idem::identity {

enum class KeyType { rsa, ec };

struct PublicKey {
  std::string kid;    // "" when the JWK has none
  std::string alg;    // the JWK's "alg", "" when absent (then any algorithm of its type)
  KeyType type = KeyType::rsa;
  std::string curve;  // EC: "P-256", "P-384" or "P-521"
  std::shared_ptr<EVP_PKEY> key;
};

// A JWKS that cannot be used: the message says why, naming the key by index and kid.
struct KeySetError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class KeySet {
 public:
  // Throws KeySetError. Refused as a whole: malformed JSON, no "keys" list, a key of a
  // known type with missing or invalid members (a point off its curve, an RSA key under
  // 2048 bits), two keys with one kid, any private key member (a JWKS given to a verifier
  // must not hold a secret), or no usable key at all. Keys of other types (oct, OKP) or
  // whose "use" is not "sig" are skipped and counted.
  static KeySet parse(std::string_view json);
  // Reads at most 1 MiB from `path`, then parse(). Throws KeySetError.
  static KeySet load_file(const std::string& path);

  // The key with this kid; for a token without a kid, the only key when there is exactly
  // one. nullptr otherwise.
  const PublicKey* find(std::string_view kid, bool token_has_kid) const;
  std::size_t size() const noexcept { return keys_.size(); }
  std::size_t skipped() const noexcept { return skipped_; }

 private:
  std::vector<PublicKey> keys_;
  std::size_t skipped_ = 0;
};

}  // namespace idem::identity
