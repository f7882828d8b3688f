#pragma once
// Verification of a compact JWS bearer token (RFC 7515, 7519) against a KeySet and the
// configured policy. Pure: the clock is a parameter; tested with keys and tokens the test
// makes with OpenSSL (tests/identity/).
//
// Accepted algorithms: RS256/384/512, PS256/384/512, ES256/384/512, each only with a key
// of its own type (and curve, for ES). "none" and every HS* algorithm are refused before
// any key is looked at: with a JWKS of public keys, an HMAC "verified" with a public key
// as its secret is the classic algorithm-confusion forgery. The signature is checked
// before the claims are read; then iss, aud, exp (required), nbf and the tenant and
// principal claims.
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "identity/jwks.hpp"

namespace idem::identity {

enum class TokenError {
  none,
  malformed,       // not three base64url parts of JSON objects, a crit header, ...
  algorithm,       // none, HS*, an unknown alg, or one that does not fit the key
  unknown_key,     // the kid is not in the JWKS (or no kid with several keys)
  signature,       // the signature does not verify
  issuer,          // iss missing or not accepted
  audience,        // aud missing or none accepted
  expired,         // exp missing, or passed (beyond the leeway)
  not_yet_valid,   // nbf in the future (beyond the leeway)
  claim,           // the tenant or principal claim missing or not a valid value
};

struct TokenPolicy {
  std::vector<std::string> issuers;
  std::vector<std::string> audiences;
  std::string tenant_claim;
  std::string principal_claim;  // "" = no principal wanted
  std::chrono::seconds leeway{30};
};

struct TokenResult {
  TokenError error = TokenError::none;
  std::string reason;     // for the log and the problem detail; never the token itself
  std::string tenant;     // when error == none
  std::string principal;  // when error == none and the policy names a principal claim
};

// Tokens longer than this are refused unread (the header limit bounds them anyway).
constexpr std::size_t kMaxTokenBytes = 16u << 10;

TokenResult verify_token(std::string_view token, const KeySet& keys, const TokenPolicy& policy,
                         std::chrono::system_clock::time_point now);

// Whether `value` may scope records: 1-255 visible ASCII characters (the rule the tenant
// header follows too).
bool valid_tenant_value(std::string_view value) noexcept;

}  // namespace idem::identity
