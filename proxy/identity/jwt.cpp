#include "identity/jwt.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>

#include <openssl/bn.h>
#include <openssl/ecdsa.h>
#include <openssl/rsa.h>

#include "identity/base64url.hpp"
#include "idempotency/json.hpp"

namespace idem::identity {
namespace {

using idempotency::Json;

enum class Family { rs, ps, es };

struct Algorithm {
  std::string_view name;
  Family family;
  const EVP_MD* (*digest)();
  std::string_view curve;  // ES only
};

constexpr std::array<Algorithm, 9> kAlgorithms = {{
    {"RS256", Family::rs, EVP_sha256, ""}, {"RS384", Family::rs, EVP_sha384, ""},
    {"RS512", Family::rs, EVP_sha512, ""}, {"PS256", Family::ps, EVP_sha256, ""},
    {"PS384", Family::ps, EVP_sha384, ""}, {"PS512", Family::ps, EVP_sha512, ""},
    {"ES256", Family::es, EVP_sha256, "P-256"}, {"ES384", Family::es, EVP_sha384, "P-384"},
    {"ES512", Family::es, EVP_sha512, "P-521"}}};

TokenResult fail(TokenError e, std::string reason) {
  TokenResult r;
  r.error = e;
  r.reason = std::move(reason);
  return r;
}

std::optional<Json> decode_object(std::string_view part) {
  const auto bytes = base64url_decode(part);
  if (!bytes) return std::nullopt;
  std::string error;
  auto doc = idempotency::parse_json(*bytes, &error, idempotency::JsonLimits{16});
  if (!doc || !doc->as_object()) return std::nullopt;
  return doc;
}

const Json* member(const Json::Object& o, const std::string& name) {
  const auto it = o.find(name);
  return it == o.end() ? nullptr : &it->second;
}

const std::string* string_member(const Json::Object& o, const std::string& name) {
  const auto* v = member(o, name);
  return v ? std::get_if<std::string>(&v->value()) : nullptr;
}

// A NumericDate (RFC 7519 §2) in whole seconds, from the parser's canonical decimal text:
// a non-negative integer, or one with a fraction (dropped). Exponent forms appear only for
// values far beyond any date and are refused with negatives.
std::optional<std::int64_t> numeric_date(const Json& v) {
  const auto* n = std::get_if<Json::Number>(&v.value());
  if (!n) return std::nullopt;
  const std::string_view text = n->canonical;
  const auto end = std::min(text.find('.'), text.size());
  if (end == 0 || end > 15) return std::nullopt;
  std::int64_t out = 0;
  for (std::size_t i = 0; i < end; ++i) {
    if (text[i] < '0' || text[i] > '9') return std::nullopt;
    out = out * 10 + (text[i] - '0');
  }
  return out;
}

struct BnFree {
  void operator()(BIGNUM* b) const noexcept { BN_free(b); }
};

// JWS carries an ECDSA signature as R || S of the curve's size; OpenSSL verifies DER.
std::optional<std::string> ecdsa_der(std::string_view raw, std::size_t coordinate_bytes) {
  if (raw.size() != 2 * coordinate_bytes) return std::nullopt;
  const auto* p = reinterpret_cast<const unsigned char*>(raw.data());
  ECDSA_SIG* sig = ECDSA_SIG_new();
  if (!sig) return std::nullopt;
  BIGNUM* r = BN_bin2bn(p, static_cast<int>(coordinate_bytes), nullptr);
  BIGNUM* s = BN_bin2bn(p + coordinate_bytes, static_cast<int>(coordinate_bytes), nullptr);
  if (!r || !s || ECDSA_SIG_set0(sig, r, s) != 1) {
    BN_free(r);
    BN_free(s);
    ECDSA_SIG_free(sig);
    return std::nullopt;
  }
  unsigned char* der = nullptr;
  const int len = i2d_ECDSA_SIG(sig, &der);
  ECDSA_SIG_free(sig);
  if (len <= 0) return std::nullopt;
  std::string out(reinterpret_cast<char*>(der), static_cast<std::size_t>(len));
  OPENSSL_free(der);
  return out;
}

bool verify_signature(const Algorithm& alg, const PublicKey& key, std::string_view signed_part,
                      std::string_view signature) {
  std::string der;
  if (alg.family == Family::es) {
    const std::size_t size = alg.curve == "P-256" ? 32 : alg.curve == "P-384" ? 48 : 66;
    auto converted = ecdsa_der(signature, size);
    if (!converted) return false;
    der = std::move(*converted);
    signature = der;
  }
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> md(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_PKEY_CTX* pctx = nullptr;  // owned by md
  if (!md || EVP_DigestVerifyInit(md.get(), &pctx, alg.digest(), nullptr, key.key.get()) != 1) {
    return false;
  }
  if (alg.family == Family::ps &&
      (EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING) != 1 ||
       EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, RSA_PSS_SALTLEN_DIGEST) != 1)) {
    return false;
  }
  return EVP_DigestVerify(md.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                          signature.size(), reinterpret_cast<const unsigned char*>(signed_part.data()),
                          signed_part.size()) == 1;
}

bool fits(const Algorithm& alg, const PublicKey& key) {
  if (!key.alg.empty() && key.alg != alg.name) return false;
  if (alg.family == Family::es) return key.type == KeyType::ec && key.curve == alg.curve;
  return key.type == KeyType::rsa;
}

// The header: which algorithm, which key. Fills `alg` and `key` or returns the refusal.
std::optional<TokenResult> select_key(const Json::Object& header, const KeySet& keys,
                                      const Algorithm*& alg, const PublicKey*& key) {
  const auto* name = string_member(header, "alg");
  if (!name) return fail(TokenError::malformed, "the token header has no alg");
  if (*name == "none") return fail(TokenError::algorithm, "unsigned tokens (alg none) are refused");
  if (name->rfind("HS", 0) == 0) {
    return fail(TokenError::algorithm, "symmetric algorithms (" + *name + ") are refused");
  }
  const auto found = std::find_if(kAlgorithms.begin(), kAlgorithms.end(),
                                  [&](const Algorithm& a) { return a.name == *name; });
  if (found == kAlgorithms.end()) return fail(TokenError::algorithm, "algorithm " + *name + " is not supported");
  // RFC 7515 §4.1.11: extensions the recipient does not understand make the token invalid.
  if (member(header, "crit")) return fail(TokenError::malformed, "the token header has crit extensions");
  const auto* kid_value = member(header, "kid");
  const auto* kid = kid_value ? std::get_if<std::string>(&kid_value->value()) : nullptr;
  if (kid_value && !kid) return fail(TokenError::malformed, "the token's kid is not a string");
  key = keys.find(kid ? std::string_view(*kid) : std::string_view(), kid != nullptr);
  if (!key) {
    return fail(TokenError::unknown_key, kid ? "the token's key id is not in the JWKS"
                                             : "the token names no key id and the JWKS has several keys");
  }
  if (!fits(*found, *key)) return fail(TokenError::algorithm, "algorithm " + *name + " does not fit the key");
  alg = &*found;
  return std::nullopt;
}

bool audience_accepted(const Json& aud, const std::vector<std::string>& accepted) {
  const auto ok = [&](const std::string& a) {
    return std::find(accepted.begin(), accepted.end(), a) != accepted.end();
  };
  if (const auto* one = std::get_if<std::string>(&aud.value())) return ok(*one);
  const auto* list = aud.as_array();
  if (!list) return false;
  return std::any_of(list->begin(), list->end(), [&](const Json& v) {
    const auto* s = std::get_if<std::string>(&v.value());
    return s && ok(*s);
  });
}

// The claims of a token whose signature verified.
TokenResult check_claims(const Json::Object& claims, const TokenPolicy& policy,
                         std::chrono::system_clock::time_point now) {
  const auto* iss = string_member(claims, "iss");
  if (!iss || std::find(policy.issuers.begin(), policy.issuers.end(), *iss) == policy.issuers.end()) {
    return fail(TokenError::issuer, iss ? "the token's issuer is not accepted" : "the token has no issuer");
  }
  const auto* aud = member(claims, "aud");
  if (!aud || !audience_accepted(*aud, policy.audiences)) {
    return fail(TokenError::audience, aud ? "the token is not meant for an accepted audience"
                                          : "the token has no audience");
  }
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
  const auto leeway = policy.leeway.count();
  const auto* exp_value = member(claims, "exp");
  const auto exp = exp_value ? numeric_date(*exp_value) : std::nullopt;
  if (!exp) return fail(TokenError::expired, "the token has no valid expiry (exp)");
  if (seconds >= *exp + leeway) return fail(TokenError::expired, "the token has expired");
  if (const auto* nbf_value = member(claims, "nbf")) {
    const auto nbf = numeric_date(*nbf_value);
    if (!nbf) return fail(TokenError::malformed, "the token's nbf is not a NumericDate");
    if (seconds + leeway < *nbf) return fail(TokenError::not_yet_valid, "the token is not valid yet");
  }
  TokenResult out;
  const auto* tenant = string_member(claims, policy.tenant_claim);
  if (!tenant || !valid_tenant_value(*tenant)) {
    return fail(TokenError::claim, "the token's " + policy.tenant_claim +
                                       " claim is missing or not 1-255 visible ASCII characters");
  }
  out.tenant = *tenant;
  if (!policy.principal_claim.empty()) {
    const auto* principal = string_member(claims, policy.principal_claim);
    if (!principal || principal->empty() || principal->size() > 1024) {
      return fail(TokenError::claim, "the token's " + policy.principal_claim + " claim is missing or invalid");
    }
    out.principal = *principal;
  }
  return out;
}

}  // namespace

bool valid_tenant_value(std::string_view t) noexcept {
  if (t.empty() || t.size() > 255) return false;
  return std::all_of(t.begin(), t.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

TokenResult verify_token(std::string_view token, const KeySet& keys, const TokenPolicy& policy,
                         std::chrono::system_clock::time_point now) {
  if (token.size() > kMaxTokenBytes) return fail(TokenError::malformed, "the token is too long");
  const auto first = token.find('.');
  const auto second = first == std::string_view::npos ? first : token.find('.', first + 1);
  if (second == std::string_view::npos || token.find('.', second + 1) != std::string_view::npos) {
    return fail(TokenError::malformed, "the token is not a compact JWS (three parts)");
  }
  const auto header = decode_object(token.substr(0, first));
  if (!header) return fail(TokenError::malformed, "the token header is not base64url JSON");
  const Algorithm* alg = nullptr;
  const PublicKey* key = nullptr;
  if (auto refused = select_key(*header->as_object(), keys, alg, key)) return std::move(*refused);
  const auto signature = base64url_decode(token.substr(second + 1));
  if (!signature || signature->empty()) return fail(TokenError::malformed, "the signature is not base64url");
  if (!verify_signature(*alg, *key, token.substr(0, second), *signature)) {
    return fail(TokenError::signature, "the token's signature does not verify");
  }
  const auto claims = decode_object(token.substr(first + 1, second - first - 1));
  if (!claims) return fail(TokenError::malformed, "the token's claims are not base64url JSON");
  return check_claims(*claims->as_object(), policy, now);
}

}  // namespace idem::identity
