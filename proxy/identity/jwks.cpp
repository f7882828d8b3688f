#include "identity/jwks.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/param_build.h>

#include "identity/base64url.hpp"
#include "idempotency/json.hpp"

namespace idem::identity {
namespace {

using idempotency::Json;

constexpr std::size_t kMaxFileBytes = 1u << 20;
constexpr std::size_t kMaxKeys = 100;
constexpr int kMinRsaBits = 2048;

// Members that only a private (or symmetric) key has.
constexpr std::array<std::string_view, 7> kPrivateMembers = {"d", "p", "q", "dp", "dq", "qi", "k"};

struct Curve {
  std::string_view jwk_name;
  const char* openssl_name;
  std::size_t coordinate_bytes;
};
constexpr std::array<Curve, 3> kCurves = {{
    {"P-256", "prime256v1", 32}, {"P-384", "secp384r1", 48}, {"P-521", "secp521r1", 66}}};

struct BnFree {
  void operator()(BIGNUM* b) const noexcept { BN_free(b); }
};
struct BldFree {
  void operator()(OSSL_PARAM_BLD* b) const noexcept { OSSL_PARAM_BLD_free(b); }
};
struct ParamFree {
  void operator()(OSSL_PARAM* p) const noexcept { OSSL_PARAM_free(p); }
};
struct CtxFree {
  void operator()(EVP_PKEY_CTX* c) const noexcept { EVP_PKEY_CTX_free(c); }
};

const std::string* string_member(const Json::Object& o, const std::string& name) {
  const auto it = o.find(name);
  if (it == o.end()) return nullptr;
  return std::get_if<std::string>(&it->second.value());
}

class KeyReader {
 public:
  KeyReader(const Json::Object& jwk, std::string where) : jwk_(jwk), where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& why) const { throw KeySetError(where_ + ": " + why); }

  // A required base64url member, decoded.
  std::string bytes(const std::string& name) const {
    const auto it = jwk_.find(name);
    if (it == jwk_.end()) fail("missing member \"" + name + "\"");
    const auto* text = std::get_if<std::string>(&it->second.value());
    if (!text) fail("member \"" + name + "\" is not a string");
    auto decoded = base64url_decode(*text);
    if (!decoded || decoded->empty()) fail("member \"" + name + "\" is not base64url");
    return *decoded;
  }

 private:
  const Json::Object& jwk_;
  std::string where_;
};

std::shared_ptr<EVP_PKEY> from_params(const char* type, OSSL_PARAM_BLD* bld, const KeyReader& r) {
  std::unique_ptr<OSSL_PARAM, ParamFree> params(OSSL_PARAM_BLD_to_param(bld));
  std::unique_ptr<EVP_PKEY_CTX, CtxFree> ctx(EVP_PKEY_CTX_new_from_name(nullptr, type, nullptr));
  EVP_PKEY* raw = nullptr;
  if (!params || !ctx || EVP_PKEY_fromdata_init(ctx.get()) != 1 ||
      EVP_PKEY_fromdata(ctx.get(), &raw, EVP_PKEY_PUBLIC_KEY, params.get()) != 1) {
    r.fail("OpenSSL refused the key: not a valid public key");
  }
  std::shared_ptr<EVP_PKEY> key(raw, EVP_PKEY_free);
  // fromdata takes the numbers as given; a point off its curve must not reach a verify.
  std::unique_ptr<EVP_PKEY_CTX, CtxFree> check(EVP_PKEY_CTX_new_from_pkey(nullptr, key.get(), nullptr));
  if (!check || EVP_PKEY_public_check(check.get()) != 1) r.fail("not a valid public key (a point off its curve?)");
  return key;
}

std::shared_ptr<EVP_PKEY> rsa_key(const KeyReader& r) {
  const auto n = r.bytes("n");
  const auto e = r.bytes("e");
  std::unique_ptr<BIGNUM, BnFree> bn_n(BN_bin2bn(reinterpret_cast<const unsigned char*>(n.data()),
                                                 static_cast<int>(n.size()), nullptr));
  std::unique_ptr<BIGNUM, BnFree> bn_e(BN_bin2bn(reinterpret_cast<const unsigned char*>(e.data()),
                                                 static_cast<int>(e.size()), nullptr));
  if (!bn_n || !bn_e) r.fail("cannot read n or e");
  if (BN_num_bits(bn_n.get()) < kMinRsaBits) {
    r.fail("RSA keys must have at least " + std::to_string(kMinRsaBits) + " bits");
  }
  std::unique_ptr<OSSL_PARAM_BLD, BldFree> bld(OSSL_PARAM_BLD_new());
  if (!bld || OSSL_PARAM_BLD_push_BN(bld.get(), OSSL_PKEY_PARAM_RSA_N, bn_n.get()) != 1 ||
      OSSL_PARAM_BLD_push_BN(bld.get(), OSSL_PKEY_PARAM_RSA_E, bn_e.get()) != 1) {
    r.fail("cannot build the key");
  }
  return from_params("RSA", bld.get(), r);
}

std::shared_ptr<EVP_PKEY> ec_key(const KeyReader& r, const Curve& curve) {
  const auto x = r.bytes("x");
  const auto y = r.bytes("y");
  if (x.size() != curve.coordinate_bytes || y.size() != curve.coordinate_bytes) {
    r.fail("x and y must be " + std::to_string(curve.coordinate_bytes) + " bytes on " +
           std::string(curve.jwk_name));
  }
  const std::string point = '\x04' + x + y;  // SEC 1 uncompressed form
  std::unique_ptr<OSSL_PARAM_BLD, BldFree> bld(OSSL_PARAM_BLD_new());
  if (!bld ||
      OSSL_PARAM_BLD_push_utf8_string(bld.get(), OSSL_PKEY_PARAM_GROUP_NAME, curve.openssl_name, 0) != 1 ||
      OSSL_PARAM_BLD_push_octet_string(bld.get(), OSSL_PKEY_PARAM_PUB_KEY, point.data(), point.size()) != 1) {
    r.fail("cannot build the key");
  }
  return from_params("EC", bld.get(), r);
}

// One entry of "keys": a key, or nullopt when it is of a kind this verifier skips.
std::optional<PublicKey> read_key(const Json& entry, std::size_t index) {
  const auto* jwk = entry.as_object();
  std::string where = "keys[" + std::to_string(index) + "]";
  if (!jwk) throw KeySetError(where + ": not an object");
  const auto* kid = string_member(*jwk, "kid");
  if (kid) where += " (kid \"" + *kid + "\")";
  const KeyReader r(*jwk, where);
  for (const auto name : kPrivateMembers) {
    if (jwk->count(std::string(name))) {
      r.fail("holds private key material (\"" + std::string(name) +
             "\"); give the sidecar public keys only");
    }
  }
  const auto* kty = string_member(*jwk, "kty");
  if (!kty) r.fail("missing member \"kty\"");
  if (const auto* use = string_member(*jwk, "use"); use && *use != "sig") return std::nullopt;
  PublicKey key;
  if (kid) key.kid = *kid;
  if (const auto* alg = string_member(*jwk, "alg")) key.alg = *alg;
  if (*kty == "RSA") {
    key.type = KeyType::rsa;
    key.key = rsa_key(r);
  } else if (*kty == "EC") {
    const auto* crv = string_member(*jwk, "crv");
    if (!crv) r.fail("missing member \"crv\"");
    const auto curve = std::find_if(kCurves.begin(), kCurves.end(),
                                    [&](const Curve& c) { return c.jwk_name == *crv; });
    if (curve == kCurves.end()) r.fail("unsupported curve \"" + *crv + "\"");
    key.type = KeyType::ec;
    key.curve = *crv;
    key.key = ec_key(r, *curve);
  } else {
    return std::nullopt;  // oct (never usable: symmetric algorithms are refused), OKP, ...
  }
  return key;
}

}  // namespace

KeySet KeySet::parse(std::string_view json) {
  std::string error;
  const auto doc = idempotency::parse_json(json, &error);
  if (!doc) throw KeySetError("not valid JSON: " + error);
  const auto* root = doc->as_object();
  if (!root) throw KeySetError("expected a JSON object with a \"keys\" list");
  const auto it = root->find("keys");
  const auto* list = it == root->end() ? nullptr : it->second.as_array();
  if (!list) throw KeySetError("expected a JSON object with a \"keys\" list");
  if (list->size() > kMaxKeys) throw KeySetError("more than " + std::to_string(kMaxKeys) + " keys");
  KeySet set;
  for (std::size_t i = 0; i < list->size(); ++i) {
    auto key = read_key((*list)[i], i);
    if (!key) {
      ++set.skipped_;
      continue;
    }
    if (!key->kid.empty() && std::any_of(set.keys_.begin(), set.keys_.end(),
                                         [&](const PublicKey& k) { return k.kid == key->kid; })) {
      throw KeySetError("keys[" + std::to_string(i) + "]: kid \"" + key->kid + "\" is used twice");
    }
    set.keys_.push_back(std::move(*key));
  }
  if (set.keys_.empty()) throw KeySetError("no RSA or EC signature key");
  return set;
}

KeySet KeySet::load_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw KeySetError("cannot read " + path + ": " + std::strerror(errno));
  std::string text(kMaxFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) throw KeySetError("cannot read " + path);
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxFileBytes) throw KeySetError(path + " is larger than 1MiB");
  try {
    return parse(text);
  } catch (const KeySetError& e) {
    throw KeySetError(path + ": " + e.what());
  }
}

const PublicKey* KeySet::find(std::string_view kid, bool token_has_kid) const {
  if (!token_has_kid) return keys_.size() == 1 ? &keys_.front() : nullptr;
  const auto it = std::find_if(keys_.begin(), keys_.end(),
                               [&](const PublicKey& k) { return !k.kid.empty() && k.kid == kid; });
  return it == keys_.end() ? nullptr : &*it;
}

}  // namespace idem::identity
