// The TLS keys (listener and upstream) and the tenant identity modes: defaults, the rules
// that tie them together, and the round trip through render_effective.
#include <doctest/doctest.h>

#include "settings/support.hpp"

using namespace idem::settings;
using namespace idem::settings::test;
using idem::Millis;

namespace {

const std::string kDatabase = "database:\n  url: postgresql://app@db/orders\n";

std::string with_upstream(const std::string& upstream) {
  return "upstream:\n" + upstream + kDatabase;
}

const std::string kJwt =
    "tenant:\n"
    "  from: jwt\n"
    "  jwt:\n"
    "    jwks_file: /etc/idemproxy/jwks.json\n"
    "    issuers: [\"https://idp.example/\"]\n"
    "    audiences: [orders-api]\n"
    "    tenant_claim: tenant\n";

}  // namespace

TEST_CASE("tls on the listener: absent by default, files required, client CA optional") {
  CHECK_FALSE(load(kMinimal)->tls.has_value());
  const auto s = load(kMinimal + "tls:\n  cert_file: /c.pem\n  key_file: /k.pem\n");
  REQUIRE(s->tls.has_value());
  CHECK(s->tls->cert_file == "/c.pem");
  CHECK(s->tls->key_file == "/k.pem");
  CHECK(s->tls->client_ca_file.empty());
  CHECK(load(kMinimal + "tls: {cert_file: /c, key_file: /k, client_ca_file: /ca}\n")->tls->client_ca_file == "/ca");
  CHECK_CONFIG_ERROR(kMinimal + "tls:\n  key_file: /k.pem\n", 5, "tls.cert_file", "missing required key");
  CHECK_CONFIG_ERROR(kMinimal + "tls:\n  cert_file: /c.pem\n", 5, "tls.key_file", "missing required key");
  CHECK_CONFIG_ERROR(kMinimal + "tls:\n  cert_file: \"\"\n  key_file: /k\n", 6, "tls.cert_file", "must not be empty");
  CHECK_CONFIG_ERROR(kMinimal + "tls:\n  cert: /c.pem\n", 6, "tls.cert", "unknown key 'cert'");
}

TEST_CASE("an https upstream: port 443, verification on, server name from the url") {
  const auto s = load(with_upstream("  url: https://orders.internal/api\n"));
  CHECK(s->upstream.https);
  CHECK(s->upstream.port == 443);
  CHECK(s->upstream.host == "orders.internal");
  CHECK(s->upstream.tls.verify);
  CHECK(s->upstream.tls.ca_file.empty());
  CHECK(s->upstream.tls.server_name.empty());
  CHECK_FALSE(load(kMinimal)->upstream.https);
  CHECK(load(kMinimal)->upstream.port == 3000);
  CHECK(load(with_upstream("  url: HTTPS://h:8443\n"))->upstream.port == 8443);

  const auto t = load(with_upstream("  url: https://10.0.0.7:8443\n"
                                    "  tls:\n    ca_file: /ca.pem\n    server_name: orders.internal\n"
                                    "    verify: false\n"));
  CHECK(t->upstream.tls.ca_file == "/ca.pem");
  CHECK(t->upstream.tls.server_name == "orders.internal");
  CHECK_FALSE(t->upstream.tls.verify);

  CHECK_CONFIG_ERROR(with_upstream("  url: http://h\n  tls: {ca_file: /ca.pem}\n"), 3, "upstream.tls",
                     "needs an https:// upstream url");
  CHECK_CONFIG_ERROR(with_upstream("  url: https://h\n  tls: {server_name: \"a b\"}\n"), 3,
                     "upstream.tls.server_name", "not a host name");
  CHECK_CONFIG_ERROR(with_upstream("  url: https://h\n  tls: {verify: nope}\n"), 3, "upstream.tls.verify",
                     "expected true or false");
  CHECK_CONFIG_ERROR(with_upstream("  url: https://h\n  tls: {cafile: x}\n"), 3, "upstream.tls.cafile",
                     "did you mean 'ca_file'");
}

TEST_CASE("tenant.from defaults to header; jwt needs its section and only it") {
  CHECK(load(kMinimal)->tenant.from == TenantSource::header);
  const auto s = load(kMinimal + kJwt);
  CHECK(s->tenant.from == TenantSource::jwt);
  CHECK(s->tenant.jwt.jwks_file == "/etc/idemproxy/jwks.json");
  CHECK(s->tenant.jwt.issuers == std::vector<std::string>{"https://idp.example/"});
  CHECK(s->tenant.jwt.audiences == std::vector<std::string>{"orders-api"});
  CHECK(s->tenant.jwt.tenant_claim == "tenant");
  CHECK(s->tenant.jwt.principal_claim == "sub");
  CHECK(s->tenant.jwt.leeway == Millis{30000});
  CHECK(load(kMinimal + kJwt + "    leeway: 0s\n")->tenant.jwt.leeway == Millis{0});

  CHECK_CONFIG_ERROR(kMinimal + "tenant:\n  from: jwt\n", 5, "tenant.jwt", "missing required key 'jwt'");
  CHECK_CONFIG_ERROR(kMinimal + "tenant:\n  from: token\n", 6, "tenant.from", "expected header | jwt | mtls");
  // A jwt section without `from: jwt` would read as protection that is not there.
  CHECK_CONFIG_ERROR(kMinimal + "tenant:\n  jwt: {jwks_file: /j}\n", 6, "tenant.jwt",
                     "applies only with tenant.from: jwt");
  CHECK_CONFIG_ERROR(kMinimal + "tenant:\n  from: jwt\n  jwt:\n    jwks_file: /j\n    issuers: []\n"
                                "    audiences: [a]\n    tenant_claim: t\n",
                     9, "tenant.jwt.issuers", "at least one value");
  CHECK_CONFIG_ERROR(kMinimal + "tenant:\n  from: jwt\n  jwt:\n    jwks_file: /j\n    issuers: [i]\n"
                                "    tenant_claim: t\n",
                     7, "tenant.jwt.audiences", "missing required key");
  CHECK_CONFIG_ERROR(kMinimal + "tenant:\n  from: jwt\n  jwt:\n    jwks_file: /j\n    issuers: [i, i]\n"
                                "    audiences: [a]\n    tenant_claim: t\n",
                     9, "tenant.jwt.issuers[1]", "listed twice");
  CHECK_CONFIG_ERROR(kMinimal + kJwt + "    leeway: 10m\n", 12, "tenant.jwt.leeway", "at most 5m");
  CHECK_CONFIG_ERROR(kMinimal + kJwt + "    principal_claim: sub\n", 7, "tenant.jwt.principal_claim",
                     "needs tenant.principal_header");
  CHECK_CONFIG_ERROR(kMinimal + kJwt + "    algorithms: [RS256]\n", 12, "tenant.jwt.algorithms",
                     "unknown key");
  const auto p = load(kMinimal + kJwt + "    principal_claim: email\n  principal_header: X-User\n");
  CHECK(p->tenant.jwt.principal_claim == "email");
  CHECK(p->tenant.principal_header == "X-User");
  CHECK_CONFIG_ERROR(kMinimal + kJwt + "    principal_claim: tenant\n  principal_header: X-User\n", 12,
                     "tenant.jwt.principal_claim", "must differ from the tenant claim");
}

TEST_CASE("tenant.from: mtls needs client certificates and a URI prefix") {
  const std::string tls = "tls: {cert_file: /c, key_file: /k, client_ca_file: /ca}\n";
  const std::string mtls = "tenant:\n  from: mtls\n  mtls:\n    uri_prefix: spiffe://orders.example/tenant/\n";
  const auto s = load(kMinimal + tls + mtls);
  CHECK(s->tenant.from == TenantSource::mtls);
  CHECK(s->tenant.mtls.uri_prefix == "spiffe://orders.example/tenant/");
  CHECK_CONFIG_ERROR(kMinimal + mtls, 5, "tenant", "needs tls.client_ca_file");
  CHECK_CONFIG_ERROR(kMinimal + "tls: {cert_file: /c, key_file: /k}\n" + mtls, 6, "tenant",
                     "needs tls.client_ca_file");
  CHECK_CONFIG_ERROR(kMinimal + tls + "tenant:\n  from: mtls\n", 6, "tenant.mtls", "missing required key");
  CHECK_CONFIG_ERROR(kMinimal + tls + "tenant:\n  from: mtls\n  mtls: {uri_prefix: \"spiffe://x/tenant\"}\n", 8,
                     "tenant.mtls.uri_prefix", "ending in '/'");
  CHECK_CONFIG_ERROR(kMinimal + tls + "tenant:\n  mtls: {uri_prefix: \"spiffe://x/\"}\n", 7, "tenant.mtls",
                     "applies only with tenant.from: mtls");
}

TEST_CASE("render_effective shows TLS and identity settings by path and loads back") {
  const std::string yaml = with_upstream("  url: https://10.0.0.7:8443/api\n"
                                         "  tls: {ca_file: /ca.pem, server_name: orders.internal, verify: false}\n") +
                           "tls: {cert_file: /c.pem, key_file: /k.pem, client_ca_file: /clients.pem}\n" + kJwt +
                           "    principal_claim: email\n    leeway: 90s\n  principal_header: X-User\n";
  const auto s = load(yaml);
  const auto text = render_effective(*s);
  INFO(text);
  for (const char* line : {"tls:\n  cert_file: \"/c.pem\"\n  key_file: \"/k.pem\"\n  client_ca_file: \"/clients.pem\"\n",
                           "  tls:\n    ca_file: \"/ca.pem\"\n    server_name: \"orders.internal\"\n    verify: false\n",
                           "  from: jwt\n  jwt:\n    jwks_file: \"/etc/idemproxy/jwks.json\"\n",
                           "    issuers: [\"https://idp.example/\"]\n", "    audiences: [\"orders-api\"]\n",
                           "    tenant_claim: \"tenant\"\n", "    principal_claim: \"email\"\n",
                           "    leeway: 90s\n"}) {
    INFO(line);
    CHECK(text.find(line) != std::string::npos);
  }
  const auto again = load(text);
  CHECK(render_effective(*again) == text);
  CHECK(again->upstream.https);
  CHECK_FALSE(again->upstream.tls.verify);
  CHECK(again->tenant.jwt.leeway == Millis{90000});

  const auto plain = render_effective(*load(kMinimal));
  CHECK(plain.find("# tls: not set") != std::string::npos);
  CHECK(plain.find("  from: header\n") != std::string::npos);
  CHECK(plain.find("ca_file") == std::string::npos);  // no upstream.tls for an http upstream

  const std::string mtls = kMinimal + "tls: {cert_file: /c, key_file: /k, client_ca_file: /ca}\n" +
                           "tenant:\n  from: mtls\n  mtls:\n    uri_prefix: spiffe://orders.example/tenant/\n";
  const auto m = load(mtls);
  const auto mtext = render_effective(*m);
  CHECK(mtext.find("  mtls:\n    uri_prefix: \"spiffe://orders.example/tenant/\"\n") != std::string::npos);
  CHECK(load(mtext)->tenant.mtls.uri_prefix == "spiffe://orders.example/tenant/");
}
