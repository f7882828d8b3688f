// Bearer tokens against a JWKS: accepted with RS256, ES256 (and the other algorithms of
// their families); refused for every way a token can be wrong. Keys and tokens are made
// here with OpenSSL (test_support/crypto.hpp).
#include <doctest/doctest.h>

#include <chrono>

#include "identity/base64url.hpp"
#include "identity/jwks.hpp"
#include "identity/jwt.hpp"
#include "test_support/crypto.hpp"

using namespace idem::identity;
using idem::test::KeyPair;
using idem::test::sign_jwt;
using idem::test::unsigned_jwt;

namespace {

const std::int64_t kNow = 1'750'000'000;
const auto kClock = std::chrono::system_clock::time_point(std::chrono::seconds(kNow));

struct Keys {
  KeyPair rsa = KeyPair::rsa(2048);
  KeyPair ec = KeyPair::ec("P-256");
  KeyPair ec384 = KeyPair::ec("P-384");
  KeyPair other_rsa = KeyPair::rsa(2048);
  KeySet set = KeySet::parse(idem::test::jwks(
      {rsa.public_jwk("rsa-1"), ec.public_jwk("ec-1", "ES256"), ec384.public_jwk("ec-384")}));
};

const Keys& keys() {
  static const Keys k;  // RSA key generation is slow: once per test binary
  return k;
}

TokenPolicy policy() {
  TokenPolicy p;
  p.issuers = {"https://idp.example/", "https://other-idp.example/"};
  p.audiences = {"orders-api"};
  p.tenant_claim = "tenant";
  p.principal_claim = "sub";
  p.leeway = std::chrono::seconds(30);
  return p;
}

std::string claims(std::int64_t exp_offset = 300, std::string extra = {}, std::string aud = "\"orders-api\"",
                   std::string iss = "https://idp.example/") {
  return "{\"iss\":\"" + iss + "\",\"aud\":" + aud + ",\"sub\":\"user-7\",\"tenant\":\"acme\",\"exp\":" +
         std::to_string(kNow + exp_offset) + extra + "}";
}

std::string header(std::string_view alg, std::string_view kid) {
  return "{\"alg\":\"" + std::string(alg) + "\",\"typ\":\"JWT\",\"kid\":\"" + std::string(kid) + "\"}";
}

TokenResult verify(const std::string& token, const TokenPolicy& p = policy()) {
  return verify_token(token, keys().set, p, kClock);
}

}  // namespace

TEST_CASE("base64url is strict") {
  CHECK(base64url_decode("") == std::string());
  CHECK(base64url_decode("YQ") == std::string("a"));
  CHECK(base64url_decode("YWI") == std::string("ab"));
  CHECK(base64url_decode("YWJj") == std::string("abc"));
  CHECK(base64url_decode("-_8") == std::string("\xfb\xff"));
  CHECK_FALSE(base64url_decode("YQ==").has_value());  // padding
  CHECK_FALSE(base64url_decode("Y").has_value());     // no encoding is 1 mod 4 long
  CHECK_FALSE(base64url_decode("YR").has_value());    // unused bits set: a second spelling of "a"
  CHECK_FALSE(base64url_decode("+/8").has_value());   // base64, not base64url
  CHECK_FALSE(base64url_decode("YW J").has_value());
  for (const std::string s : {"", "a", "ab", "abc", "\x00\xff\x10 binary"}) {
    CHECK(base64url_decode(base64url_encode(s)) == s);
  }
}

TEST_CASE("accepted: RS256 and ES256 tokens with the tenant and principal claims") {
  const auto rs = verify(sign_jwt(header("RS256", "rsa-1"), claims(), keys().rsa, "RS256"));
  CHECK(rs.error == TokenError::none);
  CHECK(rs.tenant == "acme");
  CHECK(rs.principal == "user-7");
  const auto es = verify(sign_jwt(header("ES256", "ec-1"), claims(), keys().ec, "ES256"));
  CHECK(es.error == TokenError::none);
  CHECK(es.tenant == "acme");
  // The other algorithms of each family, an audience list, the second issuer, nbf passed.
  for (const char* alg : {"RS384", "RS512", "PS256", "PS384", "PS512"}) {
    INFO(alg);
    CHECK(verify(sign_jwt(header(alg, "rsa-1"), claims(), keys().rsa, alg)).error == TokenError::none);
  }
  CHECK(verify(sign_jwt(header("ES384", "ec-384"), claims(), keys().ec384, "ES384")).error == TokenError::none);
  CHECK(verify(sign_jwt(header("RS256", "rsa-1"), claims(300, ",\"nbf\":" + std::to_string(kNow - 10),
                                                          "[\"billing\",\"orders-api\"]", "https://other-idp.example/"),
                        keys().rsa, "RS256"))
            .error == TokenError::none);
  // No principal wanted: none read, none required.
  auto p = policy();
  p.principal_claim.clear();
  CHECK(verify(sign_jwt(header("RS256", "rsa-1"), "{\"iss\":\"https://idp.example/\",\"aud\":\"orders-api\","
                                                   "\"tenant\":\"t1\",\"exp\":" + std::to_string(kNow + 60) + "}",
                        keys().rsa, "RS256"),
               p)
            .tenant == "t1");
}

TEST_CASE("refused: a bad signature") {
  const auto good = sign_jwt(header("RS256", "rsa-1"), claims(), keys().rsa, "RS256");
  // Signed by a key that is not the one the kid names.
  CHECK(verify(sign_jwt(header("RS256", "rsa-1"), claims(), keys().other_rsa, "RS256")).error ==
        TokenError::signature);
  // The claims changed after signing (the tenant rewritten).
  const auto dot1 = good.find('.');
  const auto dot2 = good.rfind('.');
  std::string forged_claims = claims();
  forged_claims.replace(forged_claims.find("acme"), 4, "evil");
  const auto tampered = good.substr(0, dot1 + 1) + base64url_encode(forged_claims) + good.substr(dot2);
  CHECK(verify(tampered).error == TokenError::signature);
  // An ES256 signature with one bit flipped, and one of the wrong length.
  auto es = sign_jwt(header("ES256", "ec-1"), claims(), keys().ec, "ES256");
  auto sig = *base64url_decode(es.substr(es.rfind('.') + 1));
  sig[5] = static_cast<char>(sig[5] ^ 1);
  CHECK(verify(es.substr(0, es.rfind('.') + 1) + base64url_encode(sig)).error == TokenError::signature);
  CHECK(verify(es.substr(0, es.rfind('.') + 1) + base64url_encode(sig.substr(1))).error == TokenError::signature);
}

TEST_CASE("refused: alg none, HS256 with the public key as secret, an unknown algorithm, a misfit") {
  const auto none = verify(unsigned_jwt("{\"alg\":\"none\",\"kid\":\"rsa-1\"}", claims()));
  CHECK(none.error == TokenError::algorithm);
  CHECK(none.reason.find("alg none") != std::string::npos);
  CHECK(verify(unsigned_jwt("{\"alg\":\"none\"}", claims(), "")).error == TokenError::algorithm);
  // The classic confusion: an HMAC keyed with the (public) RSA modulus text.
  const std::string hs_header = "{\"alg\":\"HS256\",\"kid\":\"rsa-1\"}";
  CHECK(verify(unsigned_jwt(hs_header, claims(), "any mac")).error == TokenError::algorithm);
  CHECK(verify(unsigned_jwt("{\"alg\":\"EdDSA\",\"kid\":\"rsa-1\"}", claims(), "x")).error == TokenError::algorithm);
  // An RSA key named by an ES256 header, and the EC key (alg ES256 in its JWK) with ES384.
  CHECK(verify(sign_jwt(header("ES256", "rsa-1"), claims(), keys().ec, "ES256")).error == TokenError::algorithm);
  CHECK(verify(sign_jwt(header("ES384", "ec-1"), claims(), keys().ec384, "ES384")).error == TokenError::algorithm);
  CHECK(verify(sign_jwt(header("RS256", "ec-1"), claims(), keys().rsa, "RS256")).error == TokenError::algorithm);
}

TEST_CASE("refused: a key id not in the JWKS, or none when there are several keys") {
  CHECK(verify(sign_jwt(header("RS256", "rsa-2"), claims(), keys().rsa, "RS256")).error == TokenError::unknown_key);
  CHECK(verify(sign_jwt("{\"alg\":\"RS256\"}", claims(), keys().rsa, "RS256")).error == TokenError::unknown_key);
  CHECK(verify(sign_jwt("{\"alg\":\"RS256\",\"kid\":7}", claims(), keys().rsa, "RS256")).error == TokenError::malformed);
  // With a single key, a token without kid is checked against it.
  const auto one = KeySet::parse(idem::test::jwks({keys().rsa.public_jwk("only")}));
  CHECK(verify_token(sign_jwt("{\"alg\":\"RS256\"}", claims(), keys().rsa, "RS256"), one, policy(), kClock).error ==
        TokenError::none);
}

TEST_CASE("refused: wrong issuer or audience") {
  const auto sign = [](const std::string& c) { return sign_jwt(header("RS256", "rsa-1"), c, keys().rsa, "RS256"); };
  CHECK(verify(sign(claims(300, {}, "\"orders-api\"", "https://evil.example/"))).error == TokenError::issuer);
  CHECK(verify(sign(claims(300, {}, "\"orders-api\"", "https://idp.example"))).error == TokenError::issuer);  // exact
  CHECK(verify(sign("{\"aud\":\"orders-api\",\"tenant\":\"acme\",\"exp\":" + std::to_string(kNow + 60) + "}")).error ==
        TokenError::issuer);
  CHECK(verify(sign(claims(300, {}, "\"billing\""))).error == TokenError::audience);
  CHECK(verify(sign(claims(300, {}, "[\"billing\",\"shipping\"]"))).error == TokenError::audience);
  CHECK(verify(sign(claims(300, {}, "[]"))).error == TokenError::audience);
  CHECK(verify(sign("{\"iss\":\"https://idp.example/\",\"tenant\":\"acme\",\"exp\":" + std::to_string(kNow + 60) +
                    "}"))
            .error == TokenError::audience);
}

TEST_CASE("refused: expired, not yet valid, no expiry; the leeway applies to both") {
  const auto sign = [](const std::string& c) { return sign_jwt(header("ES256", "ec-1"), c, keys().ec, "ES256"); };
  CHECK(verify(sign(claims(-31))).error == TokenError::expired);
  CHECK(verify(sign(claims(-30))).error == TokenError::expired);  // exp + leeway is already past
  CHECK(verify(sign(claims(-29))).error == TokenError::none);     // within the leeway
  CHECK(verify(sign(claims(300, ",\"nbf\":" + std::to_string(kNow + 31)))).error == TokenError::not_yet_valid);
  CHECK(verify(sign(claims(300, ",\"nbf\":" + std::to_string(kNow + 30)))).error == TokenError::none);
  CHECK(verify(sign(claims(300, ",\"nbf\":\"soon\""))).error == TokenError::malformed);
  auto strict = policy();
  strict.leeway = std::chrono::seconds(0);
  CHECK(verify(sign(claims(0)), strict).error == TokenError::expired);
  CHECK(verify(sign(claims(1)), strict).error == TokenError::none);
  const std::string no_exp = "{\"iss\":\"https://idp.example/\",\"aud\":\"orders-api\",\"tenant\":\"acme\",\"sub\":\"u\"}";
  CHECK(verify(sign(no_exp)).error == TokenError::expired);
  const std::string text_exp = "{\"iss\":\"https://idp.example/\",\"aud\":\"orders-api\",\"tenant\":\"acme\","
                               "\"sub\":\"u\",\"exp\":\"tomorrow\"}";
  CHECK(verify(sign(text_exp)).error == TokenError::expired);
  // A NumericDate is any JSON number: 1.75e9 is the date it is; a negative one is refused.
  const auto with_exp = [](const std::string& exp) {
    return "{\"iss\":\"https://idp.example/\",\"aud\":\"orders-api\",\"tenant\":\"acme\",\"sub\":\"u\",\"exp\":" +
           exp + "}";
  };
  CHECK(verify(sign(with_exp("1.75e9"))).error == TokenError::none);
  CHECK(verify(sign(with_exp("1750000060.5"))).error == TokenError::none);
  CHECK(verify(sign(with_exp("-1"))).error == TokenError::expired);
}

TEST_CASE("refused: tenant or principal claim missing or unusable") {
  const auto sign = [](const std::string& c) { return sign_jwt(header("RS256", "rsa-1"), c, keys().rsa, "RS256"); };
  const std::string base = "{\"iss\":\"https://idp.example/\",\"aud\":\"orders-api\",\"exp\":" +
                           std::to_string(kNow + 60);
  CHECK(verify(sign(base + ",\"sub\":\"u\"}")).error == TokenError::claim);
  CHECK(verify(sign(base + ",\"sub\":\"u\",\"tenant\":\"\"}")).error == TokenError::claim);
  CHECK(verify(sign(base + ",\"sub\":\"u\",\"tenant\":\"a b\"}")).error == TokenError::claim);
  CHECK(verify(sign(base + ",\"sub\":\"u\",\"tenant\":42}")).error == TokenError::claim);
  CHECK(verify(sign(base + ",\"tenant\":\"acme\"}")).error == TokenError::claim);  // principal wanted
}

TEST_CASE("refused: malformed tokens") {
  for (const std::string t : {"", "abc", "a.b", "a.b.c.d", "..", "e30.e30.", "!!.e30.AA"}) {
    INFO(t);
    CHECK(verify(t).error == TokenError::malformed);
  }
  // Duplicate claims are refused by the strict parser, not read either way.
  const auto dup = sign_jwt(header("RS256", "rsa-1"), claims(300, ",\"tenant\":\"evil\""), keys().rsa, "RS256");
  CHECK(verify(dup).error == TokenError::malformed);
  CHECK(verify(sign_jwt("{\"alg\":\"RS256\",\"kid\":\"rsa-1\",\"crit\":[\"exp\"]}", claims(), keys().rsa, "RS256"))
            .error == TokenError::malformed);
  CHECK(verify(std::string(kMaxTokenBytes + 1, 'a')).error == TokenError::malformed);
}

TEST_CASE("JWKS: what is refused, what is skipped") {
  const auto rsa = keys().rsa.public_jwk("a");
  CHECK(KeySet::parse(idem::test::jwks({rsa})).size() == 1);
  const auto skipped = KeySet::parse(idem::test::jwks(
      {rsa, "{\"kty\":\"oct\",\"kid\":\"h\",\"use\":\"sig\"}", "{\"kty\":\"OKP\",\"crv\":\"Ed25519\",\"x\":\"AA\"}",
       [] {
         auto jwk = keys().ec.public_jwk("enc-key");
         return jwk.replace(jwk.find("\"use\":\"sig\""), 11, "\"use\":\"enc\"");
       }()}));
  CHECK(skipped.size() == 1);
  CHECK(skipped.skipped() == 3);
  const auto refused = [](const std::string& text, const char* fragment) {
    INFO(text);
    try {
      KeySet::parse(text);
      FAIL("accepted");
    } catch (const KeySetError& e) {
      CHECK(std::string(e.what()).find(fragment) != std::string::npos);
    }
  };
  refused("not json", "not valid JSON");
  refused("{\"keys\":{}}", "\"keys\" list");
  refused("{\"keys\":[]}", "no RSA or EC signature key");
  refused(idem::test::jwks({rsa, rsa}), "used twice");
  refused(idem::test::jwks({"{\"kty\":\"oct\",\"k\":\"c2VjcmV0\"}"}), "private key material");
  refused(idem::test::jwks({rsa.substr(0, rsa.size() - 1) + ",\"d\":\"AQAB\"}"}), "private key material");
  refused(idem::test::jwks({KeyPair::rsa(1024).public_jwk("small")}), "at least 2048 bits");
  refused(idem::test::jwks({"{\"kty\":\"RSA\",\"kid\":\"x\",\"e\":\"AQAB\"}"}), "missing member \"n\"");
  refused(idem::test::jwks({"{\"kty\":\"EC\",\"crv\":\"P-256K\",\"x\":\"AA\",\"y\":\"AA\"}"}), "unsupported curve");
  // A point that is not on P-256.
  const std::string x(43, 'A');
  refused(idem::test::jwks({"{\"kty\":\"EC\",\"crv\":\"P-256\",\"x\":\"" + x + "\",\"y\":\"" + std::string(42, 'A') +
                            "E\"}"}),
          "not a valid public key");
  CHECK_THROWS_AS(KeySet::load_file("/nonexistent/jwks.json"), KeySetError);
}
