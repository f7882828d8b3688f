// The request-level step of tenant.from: jwt | mtls: client identity headers refused, the
// bearer token read, the certificate's URI SAN mapped, the verified identity written.
#include <doctest/doctest.h>

#include <boost/beast/http/fields.hpp>

#include "identity/identity.hpp"
#include "test_support/crypto.hpp"

using namespace idem::identity;
namespace http = boost::beast::http;

namespace {

idem::settings::TenantSettings jwt_settings() {
  idem::settings::TenantSettings t;
  t.from = idem::settings::TenantSource::jwt;
  t.principal_header = "X-User-Id";
  t.jwt.issuers = {"https://idp.example/"};
  t.jwt.audiences = {"orders-api"};
  t.jwt.tenant_claim = "org";
  t.jwt.principal_claim = "sub";
  return t;
}

struct Fixture {
  idem::test::KeyPair key = idem::test::KeyPair::ec("P-256");
  std::shared_ptr<const KeySet> set =
      std::make_shared<const KeySet>(KeySet::parse(idem::test::jwks({key.public_jwk("k1")})));
  Resolver resolver{jwt_settings(), set};

  std::string token(std::int64_t exp_offset = 120) const {
    return idem::test::sign_jwt("{\"alg\":\"ES256\",\"kid\":\"k1\"}",
                                "{\"iss\":\"https://idp.example/\",\"aud\":\"orders-api\",\"org\":\"acme\","
                                "\"sub\":\"user-1\",\"exp\":" + std::to_string(idem::test::unix_now() + exp_offset) + "}",
                                key, "ES256");
  }
};

Resolution resolve(const Resolver& r, const http::fields& f, std::span<const std::string> uris = {}) {
  return r.resolve(f, uris, std::chrono::system_clock::now());
}

}  // namespace

TEST_CASE("bearer_token reads one Authorization: Bearer token68") {
  http::fields f;
  CHECK_FALSE(bearer_token(f).present);
  f.set(http::field::authorization, "Bearer abc.def.ghi");
  auto b = bearer_token(f);
  CHECK(b.present);
  CHECK(b.well_formed);
  CHECK(b.token == "abc.def.ghi");
  f.set(http::field::authorization, "bearer   abc.def.ghi  ");
  CHECK(bearer_token(f).token == "abc.def.ghi");
  f.set(http::field::authorization, "Basic dXNlcjpwYXNz");
  CHECK_FALSE(bearer_token(f).well_formed);
  f.set(http::field::authorization, "Bearer a b");
  CHECK_FALSE(bearer_token(f).well_formed);
  f.set(http::field::authorization, "Bearer");
  CHECK_FALSE(bearer_token(f).well_formed);
  f.insert(http::field::authorization, "Bearer x.y.z");
  CHECK(bearer_token(f).several);
}

TEST_CASE("jwt mode: a verified token sets the tenant and principal headers") {
  Fixture fx;
  http::fields f;
  f.set(http::field::authorization, "Bearer " + fx.token());
  const auto r = resolve(fx.resolver, f);
  REQUIRE(r.ok);
  CHECK(r.tenant == "acme");
  CHECK(r.principal == "user-1");
  fx.resolver.apply(r, f);
  CHECK(f["X-Tenant-Id"] == "acme");
  CHECK(f["X-User-Id"] == "user-1");
}

TEST_CASE("jwt mode: refusals and their codes") {
  Fixture fx;
  const auto refused = [&](http::fields& f, http::status status, std::string_view code) {
    const auto r = resolve(fx.resolver, f);
    CHECK_FALSE(r.ok);
    CHECK(r.status == status);
    CHECK(r.code == code);
    return r;
  };
  http::fields none;
  CHECK(refused(none, http::status::unauthorized, "token_missing").challenge == "Bearer realm=\"idemproxy\"");

  // A client-sent tenant header is refused even with a valid token, and so is the principal header.
  http::fields with_tenant;
  with_tenant.set(http::field::authorization, "Bearer " + fx.token());
  with_tenant.set("x-tenant-id", "acme");
  const auto r = refused(with_tenant, http::status::bad_request, "identity_header_forbidden");
  CHECK(r.detail.find("X-Tenant-Id") != std::string::npos);
  http::fields with_empty_tenant;
  with_empty_tenant.set(http::field::authorization, "Bearer " + fx.token());
  with_empty_tenant.set("X-Tenant-Id", "");
  refused(with_empty_tenant, http::status::bad_request, "identity_header_forbidden");
  http::fields with_principal;
  with_principal.set(http::field::authorization, "Bearer " + fx.token());
  with_principal.set("X-User-Id", "someone-else");
  refused(with_principal, http::status::bad_request, "identity_header_forbidden");

  http::fields expired;
  expired.set(http::field::authorization, "Bearer " + fx.token(-3600));
  CHECK(refused(expired, http::status::unauthorized, "token_expired").challenge.find("invalid_token") !=
        std::string_view::npos);
  http::fields basic;
  basic.set(http::field::authorization, "Basic dXNlcjpwYXNz");
  refused(basic, http::status::unauthorized, "token_missing");
  http::fields two;
  two.insert(http::field::authorization, "Bearer " + fx.token());
  two.insert(http::field::authorization, "Bearer " + fx.token());
  refused(two, http::status::unauthorized, "token_invalid");
  http::fields garbage;
  garbage.set(http::field::authorization, "Bearer a.b.c");
  refused(garbage, http::status::unauthorized, "token_invalid");
}

TEST_CASE("mtls: the tenant is the segment after the prefix, the URI the principal") {
  const std::string prefix = "spiffe://orders.example/tenant/";
  const std::vector<std::string> one{"spiffe://orders.example/tenant/acme/client/web"};
  const auto r = from_certificate(one, prefix);
  REQUIRE(r.ok);
  CHECK(r.tenant == "acme");
  CHECK(r.principal == one.front());
  CHECK(from_certificate(std::vector<std::string>{"spiffe://orders.example/tenant/beta"}, prefix).tenant == "beta");
  // Other URIs beside the one under the prefix are ignored.
  CHECK(from_certificate(std::vector<std::string>{"https://example/x", one.front()}, prefix).ok);

  for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
           {},
           {"spiffe://orders.example/other/acme"},
           {"spiffe://orders.example/tenant/"},
           {"spiffe://orders.example/tenant//x"},
           {"spiffe://orders.example/tenant/a%2Fb"},
           {"spiffe://orders.example/tenant/acme", "spiffe://orders.example/tenant/beta"},
           {"SPIFFE://orders.example/tenant/acme"}}) {
    INFO(bad.size());
    const auto refused = from_certificate(bad, prefix);
    CHECK_FALSE(refused.ok);
    CHECK(refused.code == "certificate_tenant_invalid");
    CHECK(refused.status == http::status::unauthorized);
  }

  idem::settings::TenantSettings t;
  t.from = idem::settings::TenantSource::mtls;
  t.mtls.uri_prefix = prefix;
  const Resolver resolver(t, nullptr);
  http::fields f;
  const auto verified = resolve(resolver, f, one);
  REQUIRE(verified.ok);
  CHECK(verified.principal.empty());  // no principal header configured
  resolver.apply(verified, f);
  CHECK(f["X-Tenant-Id"] == "acme");
  f.set("X-Tenant-Id", "evil");
  CHECK(resolve(resolver, f, one).code == "identity_header_forbidden");
}
